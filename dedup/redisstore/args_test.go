package redisstore

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"runtime"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/internal/storekit"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// A Mark of several entries (markMany, setNXCmds): its commands share one argument slab, one
// boxed TTL and, while the entries' token and fingerprint repeat (a Mark call's share
// its token), one encoded record: two allocations per entry (its command, its key
// boxed) and a few per batch, where a []any per command took six per entry. The
// arguments are those of a Mark of one entry (SET NX PX, or SET NX PX GET), TTL
// and token changes within a batch included.
func TestMarkManyCommandAllocations(t *testing.T) {
	ctx := context.Background()
	const n = 64
	entries := make([]driver.Entry, n)
	for i := range entries {
		entries[i] = driver.Entry{Key: fmt.Sprintf("dk:h:k%d", i), Token: "tok", Fingerprint: "fp", TTL: time.Hour}
	}
	entries[10].TTL, entries[11].TTL = time.Minute, 2*time.Minute
	entries[20].Token, entries[21].Fingerprint = "other", "fp2"
	for _, get := range []bool{false, true} {
		cmds, sent := setNXCmds(ctx, storekit.StateDone, entries, get)
		for i, e := range entries {
			want := setNXGet(storekit.StateDone, e.Key, e.Token, e.Fingerprint, e.TTL)
			if !get {
				want = want[:len(want)-1] // no GET
			}
			if got := cmds[i].Args(); !reflect.DeepEqual(got, want) || cap(got) != len(got) {
				t.Fatalf("get %v, entry %d: args %v (cap %d), want %v with no room to grow into the next", get, i, got, cap(got), want)
			}
			if sent[i] != cmds[i] {
				t.Fatalf("entry %d: sent is not the command read", i)
			}
		}
	}
	for i := range entries {
		entries[i].TTL, entries[i].Token, entries[i].Fingerprint = time.Hour, "tok", "fp"
	}
	for _, get := range []bool{false, true} {
		allocs := testing.AllocsPerRun(20, func() { setNXCmds(ctx, storekit.StateDone, entries, get) })
		if limit := float64(2*n + 6); allocs > limit {
			t.Errorf("get %v: building %d commands allocates %.0f times, want at most %.0f", get, n, allocs, limit)
		}
	}
}

// A Claim of several entries on a cluster (claimMany): its commands share the slab
// too: per entry a SET NX PX GET (a Claim of one entry's command), a PTTL and a GET
// of the same key, each without room to grow into the next; six allocations per entry
// (three commands, the key and record boxed, the record's bytes) and six per batch,
// where separate []any took twelve per entry.
func TestClaimManyCommandAllocations(t *testing.T) {
	ctx := context.Background()
	const n = 64
	entries := make([]driver.Entry, n)
	for i := range entries {
		entries[i] = driver.Entry{Key: fmt.Sprintf("dk:h:k%d", i), Token: fmt.Sprintf("tok%d", i), TTL: 30 * time.Second}
	}
	entries[5].TTL = time.Minute
	sets, ttls, gets, sent := claimCmds(ctx, entries)
	if len(sent) != 3*n {
		t.Fatalf("%d commands sent, want %d", len(sent), 3*n)
	}
	for i, e := range entries {
		for j, c := range []struct {
			got  []any
			want []any
		}{
			{sets[i].Args(), setNXGet(storekit.StateInProgress, e.Key, e.Token, e.Fingerprint, e.TTL)},
			{ttls[i].Args(), []any{"pttl", e.Key}},
			{gets[i].Args(), []any{"get", e.Key}},
		} {
			if !reflect.DeepEqual(c.got, c.want) || cap(c.got) != len(c.got) {
				t.Fatalf("entry %d command %d: args %v (cap %d), want %v with no room to grow into the next", i, j, c.got, cap(c.got), c.want)
			}
		}
		if sent[3*i] != sets[i] || sent[3*i+1] != ttls[i] || sent[3*i+2] != gets[i] {
			t.Fatalf("entry %d: sent out of order", i)
		}
	}
	for i := range entries {
		entries[i].TTL = 30 * time.Second
	}
	allocs := testing.AllocsPerRun(20, func() { claimCmds(ctx, entries) })
	if limit := float64(6*n + 6); allocs > limit {
		t.Errorf("building %d entries' commands allocates %.0f times, want at most %.0f", n, allocs, limit)
	}
}

// A Store honours deadlines when its client ends every call by its context's
// deadline or its own read and write timeouts: ContextTimeoutEnabled and both
// timeouts, on each kind of client. Without one of them a call may outlast its
// deadline, and the Deduper must wait for it on a goroutine of its own.
func TestHonoursDeadlinesOnlyWithContextTimeoutsAndReadAndWriteTimeouts(t *testing.T) {
	for _, c := range []struct {
		name string
		c    redis.UniversalClient
		want bool
	}{
		{"defaults", redis.NewClient(&redis.Options{}), false},
		{"ContextTimeoutEnabled", redis.NewClient(&redis.Options{ContextTimeoutEnabled: true}), true},
		{"no read timeout", redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, ReadTimeout: -1}), false},
		{"no write deadline", redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, WriteTimeout: -2}), false},
		{"cluster", redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: true}), true},
		{"cluster defaults", redis.NewClusterClient(&redis.ClusterOptions{}), false},
		{"failover", redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", ContextTimeoutEnabled: true}), true},
	} {
		s, err := New(c.c)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.HonoursDeadlines(); got != c.want {
			t.Errorf("%s: HonoursDeadlines %v, want %v", c.name, got, c.want)
		}
		c.c.Close()
	}
}

// A store call's pipeline queues its commands with one append (exec): queued one by
// one, 64 commands took six more allocations than one command (16 against 10 here).
// On a real server: miniredis's replies allocate per command.
func TestExecQueuesCommandsAtOnce(t *testing.T) {
	c := testenv.Redis(t, testenv.Prefix())
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	allocs := func(n int) float64 {
		cmds := make([]redis.Cmder, n)
		for i := range cmds {
			cmds[i] = redis.NewIntCmd(ctx, "exists", "dk:exec") // an integer reply allocates nothing
		}
		return testing.AllocsPerRun(50, func() {
			if err := s.exec(ctx, cmds...); err != nil {
				t.Fatal(err)
			}
		})
	}
	if one, many := allocs(1), allocs(64); many > one+1 {
		t.Errorf("a pipeline of 64 commands allocates %.0f times, one of 1 command %.0f: want at most one more", many, one)
	}
}

// A SET NX PX without GET reserves six arguments per entry in its call's slab, seven
// only with GET: building 64 such commands allocates at least 64 × 16 bytes less.
func TestSetNXWithoutGetReservesSixArguments(t *testing.T) {
	ctx := context.Background()
	entries := make([]driver.Entry, 64)
	for i := range entries {
		entries[i] = driver.Entry{Key: fmt.Sprintf("dk:h:k%d", i), Token: "tok", TTL: time.Hour}
	}
	bytesOf := func(get bool) uint64 { // the least of several runs: other goroutines only add
		least := uint64(math.MaxUint64)
		for range 20 {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			setNXCmds(ctx, storekit.StateDone, entries, get)
			runtime.ReadMemStats(&after)
			least = min(least, after.TotalAlloc-before.TotalAlloc)
		}
		return least
	}
	if without, with := bytesOf(false), bytesOf(true); without+uint64(len(entries))*16 > with {
		t.Errorf("64 commands allocate %d bytes without GET and %d with it: want at least %d fewer without", without, with, len(entries)*16)
	}
}
