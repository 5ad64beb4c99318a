package dedup

import (
	"context"
	"testing"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/memstore"
)

// A batch's claims share one owner token (the keys of a store call are distinct), so
// its records encode once per batch; another batch takes its own.
func TestABatchsItemsShareOneOwnerToken(t *testing.T) {
	mem, _ := memstore.New()
	d, _ := New(mem, WithLogger(quiet))
	defer d.Close()
	h, _ := d.Register("tok", WithLocalCache(0, 0))
	ctx := context.Background()
	owners := func(keys ...string) []string {
		t.Helper()
		infos, err := h.LookupMany(ctx, keys)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, in := range infos {
			if in.State != driver.RecordInProgress {
				t.Fatalf("%s: state %v during the run, want in progress", in.RecordKey, in.State)
			}
			out = append(out, in.Owner)
		}
		return out
	}
	var first, second []string
	for _, r := range h.Run(ctx, []Item{{Key: "a"}, {Key: "b"}, {Key: "c"}}, func(ctx context.Context, i int) error {
		if i == 0 {
			first = owners("a", "b", "c")
		}
		return nil
	}) {
		if r.Outcome != Processed {
			t.Fatalf("first batch: %v %v", r.Outcome, r.Err)
		}
	}
	h.Run(ctx, []Item{{Key: "d"}, {Key: "e"}}, func(ctx context.Context, i int) error {
		if i == 0 {
			second = owners("d", "e")
		}
		return nil
	})
	if len(first) != 3 || first[0] == "" || first[1] != first[0] || first[2] != first[0] {
		t.Fatalf("one batch's owners %q, want one token", first)
	}
	if len(second) != 2 || second[1] != second[0] || second[0] == first[0] {
		t.Fatalf("the next batch's owners %q, want one token other than %q", second, first[0])
	}
}
