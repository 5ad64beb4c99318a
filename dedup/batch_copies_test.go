package dedup

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/dedupkit/dedupkit/dedup/memstore"
)

// A copy of a key in the same batch, under WaitForRunning (as the NATS adapter's
// Handler runs its batches), waits for the first copy's run as Do would: Duplicate
// if that run succeeded; if it failed, the copy claims the key and runs
// (docs/nats.md). Without WaitForRunning the copy is InProgress at once. The copy
// was InProgress in both cases, and the adapter Nak'ed it for a redelivery (a new
// user's trial: 252 of 300 second copies).
func TestACopyInTheBatchRunsWhenTheFirstRunFails(t *testing.T) {
	for _, c := range []struct {
		name        string
		wait, fails bool
		want        [2]Outcome
		calls       int32
	}{
		{"the first run fails", true, true, [2]Outcome{Failed, Processed}, 2},
		{"the first run succeeds", true, false, [2]Outcome{Processed, Duplicate}, 1},
		{"without WaitForRunning", false, true, [2]Outcome{Failed, InProgress}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			mem, _ := memstore.New()
			h := newDeduperOver(t, mem).mustRegister(t, "copies")
			ctx := context.Background()
			if c.wait {
				ctx = WaitForRunning(ctx)
			}
			var calls atomic.Int32
			res := h.Run(ctx, []Item{{Key: "k"}, {Key: "k"}}, func(context.Context, int) error {
				if calls.Add(1) == 1 && c.fails {
					return errors.New("the first run fails")
				}
				return nil
			}, Parallel(2))
			if res[0].Outcome != c.want[0] || res[1].Outcome != c.want[1] || calls.Load() != c.calls {
				t.Fatalf("outcomes %v, %v; fn ran %d times; want %v and %d", res[0].Outcome, res[1].Outcome, calls.Load(), c.want, c.calls)
			}
		})
	}
}
