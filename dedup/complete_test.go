package dedup

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/internal/storekit"
)

// A run whose lease was lost mid-way (forgotten, and a rival took the key over) and
// whose fn succeeded all the same is recorded: DONE under its token, Processed, so
// acked. The rival's heartbeat then finds its lease lost, its release leaves DONE
// alone, and the redelivery after it is a Duplicate: fn runs twice, not three times.
// With a reply to store the completion stays owner-checked: the first reply wins,
// and the run is LeaseLost.
func TestASuccessAfterALostLeaseIsRecorded(t *testing.T) {
	for _, replies := range []bool{false, true} {
		mem, _ := memstore.New()
		d, err := New(mem, WithLogger(quiet))
		if err != nil {
			t.Fatal(err)
		}
		var opts []HandlerOption
		if replies {
			opts = append(opts, WithReplies(0))
		}
		h, _ := d.Register("orders", append(opts, WithLease(time.Minute))...)
		ctx := context.Background()
		rk := h.RecordKey("k")
		rival := []driver.Entry{{Key: rk, Token: "rival", TTL: time.Minute}}
		fn := func(ctx context.Context) ([]byte, error) {
			if _, err := h.Forget(ctx, "k", ForgetInProgress()); err != nil {
				return nil, err
			}
			if a, err := storekit.Only(mem.Claim(ctx, rival)); err != nil || a.Status != driver.StatusAcquired {
				return nil, errors.Join(err, errors.New("the rival's claim failed"))
			}
			return []byte("ours"), nil
		}
		var res Result
		if replies {
			var ir ItemResult
			ir, err = runReply(h, ctx, "k", nil, fn)
			res = ir.Result
		} else {
			res, err = h.Do(ctx, "k", func(ctx context.Context) error { _, err := fn(ctx); return err })
		}
		if !replies {
			if res.Outcome != Processed || err != nil {
				t.Fatalf("our run: %v %v, want Processed", res.Outcome, err)
			}
			if err := storekit.OnlyErr(mem.Extend(ctx, rival)); !errors.Is(err, driver.ErrLeaseLost) {
				t.Fatalf("the rival's heartbeat: %v, want ErrLeaseLost", err)
			}
			if err := storekit.OnlyErr(mem.Release(ctx, rival)); err != nil {
				t.Fatal(err)
			}
			if info, err := h.Lookup(ctx, "k"); err != nil || info.State != driver.RecordDone {
				t.Fatalf("after the rival gave up: %+v %v", info, err)
			}
			if res, _ := h.Do(ctx, "k", func(context.Context) error { t.Error("fn ran a third time"); return nil }); res.Outcome != Duplicate {
				t.Fatalf("the redelivery: %v, want Duplicate", res.Outcome)
			}
		} else if res.Outcome != LeaseLost || !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("our run with a reply: %v %v, want LeaseLost", res.Outcome, err)
		}
		d.Close()
	}
}
