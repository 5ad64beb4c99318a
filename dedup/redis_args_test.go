package dedup

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"
)

// MarkMany's commands share one argument slab and one boxed TTL: four allocations per
// entry (its command, its key and record boxed, the record's bytes) and four per
// batch, where a []any per command took six per entry. The arguments are those of the
// single Mark's command, TTL changes within a batch included.
func TestMarkManyCommandAllocations(t *testing.T) {
	ctx := context.Background()
	const n = 64
	entries := make([]Entry, n)
	for i := range entries {
		entries[i] = Entry{Key: fmt.Sprintf("dk:h:k%d", i), Token: fmt.Sprintf("tok%d", i), Fingerprint: "fp", TTL: time.Hour}
	}
	entries[10].TTL, entries[11].TTL = time.Minute, 2*time.Minute
	cmds, sent := markCmds(ctx, entries)
	for i, e := range entries {
		want := setNXGet(stateDone, e.Key, e.Token, e.Fingerprint, e.TTL)
		if got := cmds[i].Args(); !reflect.DeepEqual(got, want) || cap(got) != len(got) {
			t.Fatalf("entry %d: args %v (cap %d), want %v with no room to grow into the next", i, got, cap(got), want)
		}
		if sent[i] != cmds[i] {
			t.Fatalf("entry %d: sent is not the command read", i)
		}
	}
	for i := range entries {
		entries[i].TTL = time.Hour
	}
	allocs := testing.AllocsPerRun(20, func() { markCmds(ctx, entries) })
	if limit := float64(4*n + 4); allocs > limit {
		t.Errorf("building %d commands allocates %.0f times, want at most %.0f", n, allocs, limit)
	}
}
