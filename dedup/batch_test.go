package dedup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestBatchGivesEachItemItsOutcome(t *testing.T) {
	f := newFixture(t, false)
	h := f.handler("orders")
	ctx := context.Background()
	if res, _ := h.Do(ctx, "done-before", ok); res.Outcome != Processed {
		t.Fatal(res)
	}
	other := newDeduperOver(t, f.store).mustRegister(t, "orders")
	if res, _ := other.Do(ctx, "done-elsewhere", ok); res.Outcome != Processed {
		t.Fatal(res)
	}
	if _, err := claim1(ctx, f.mem, h.RecordKey("busy"), "someone", "", time.Minute); err != nil {
		t.Fatal(err)
	}
	items := []Item{{Key: "a"}, {Key: "b"}, {Key: "a"}, {Key: "done-before"}, {Key: "done-elsewhere"}, {Key: ""}, {Key: "fails"}, {Key: "busy"}, {Key: "panics"}}
	var ran []int
	f.store.claims.Store(0)
	f.store.completes.Store(0)
	f.store.batches.Store(0)
	got := h.Run(ctx, items, func(_ context.Context, i int) error {
		ran = append(ran, i)
		switch items[i].Key {
		case "fails":
			return errors.New("boom")
		case "panics":
			panic("kaboom")
		}
		return nil
	})
	want := []Outcome{Processed, Processed, Duplicate, Duplicate, Duplicate, NoKey, Failed, InProgress, Panicked}
	for i, r := range got {
		if r.Outcome != want[i] {
			t.Errorf("item %d (%q): %v (%v), want %v", i, items[i].Key, r.Outcome, r.Err, want[i])
		}
	}
	if got[3].Tier != TierLocal || got[4].Tier != TierStore || got[7].RetryAfter <= 0 {
		t.Errorf("tiers %v %v, retry after %v", got[3].Tier, got[4].Tier, got[7].RetryAfter)
	}
	if fmt.Sprint(ran) != "[0 1 6 8]" {
		t.Errorf("fn ran for items %v, want [0 1 6 8]", ran)
	}
	// one Claim for the batch, and one Complete per success or fewer (each success's
	// completion goes out as its fn returns, with those queued meanwhile)
	if c, n := f.store.claims.Load(), f.store.completes.Load(); c != 1 || n < 1 || n > 2 {
		t.Errorf("claims %d completes %d, want one Claim and one or two Completes", c, n)
	}
	// the failures were released: a retry runs them
	for _, k := range []string{"fails", "panics"} {
		if res, err := h.Do(ctx, k, ok); res.Outcome != Processed {
			t.Errorf("retry of %s: %v %v", k, res.Outcome, err)
		}
	}
	if res, _ := other.Do(ctx, "a", ok); res.Outcome != Duplicate {
		t.Errorf("a not recorded DONE: %v", res.Outcome)
	}
}

func TestFilterBatchMarksInOneCallAndRunsEachKeyOnce(t *testing.T) {
	f := newFixture(t, false)
	h := f.handler("views", WithMode(ModeFilter))
	ctx := context.Background()
	items := []Item{{Key: "x"}, {Key: "y"}, {Key: "x"}}
	runs := 0
	got := h.Run(ctx, items, func(context.Context, int) error { runs++; return nil })
	if got[0].Outcome != Processed || got[1].Outcome != Processed || got[2].Outcome != Duplicate || runs != 2 {
		t.Fatalf("%v %v %v, runs %d", got[0].Outcome, got[1].Outcome, got[2].Outcome, runs)
	}
	if f.store.marks.Load() != 1 {
		t.Fatalf("%d Mark calls, want one", f.store.marks.Load())
	}
	got = h.Run(ctx, items, func(context.Context, int) error { runs++; return nil })
	for _, r := range got {
		if r.Outcome != Duplicate || r.Tier != TierLocal {
			t.Fatalf("second batch: %v %v", r.Outcome, r.Tier)
		}
	}
}

func TestBatchWithTheStoreDownFailsClosedOrRunsUnguarded(t *testing.T) {
	down := fmt.Errorf("%w: connection refused", ErrStoreUnavailable)
	for _, policy := range []StoreFailurePolicy{FailClosed, FailOpen} {
		f := newFixture(t, false)
		f.store.onFail(func(string) error { return down })
		h := f.handler("orders", WithStoreFailure(policy))
		runs := 0
		got := h.Run(context.Background(), []Item{{Key: "a"}, {Key: "b"}}, func(context.Context, int) error { runs++; return nil })
		for _, r := range got {
			wantO, wantRuns := StoreUnavailable, 0
			if policy == FailOpen {
				wantO, wantRuns = Processed, 2
			}
			if r.Outcome != wantO || runs != wantRuns || (policy == FailOpen) != r.Unguarded {
				t.Fatalf("policy %d: %v unguarded=%v runs %d", policy, r.Outcome, r.Unguarded, runs)
			}
		}
	}
}

// Items waiting their turn keep their claims: the batch heartbeat extends them all.
func TestBatchKeepsWaitingItemsClaimed(t *testing.T) {
	f := newFixture(t, true)
	lease := 90 * time.Millisecond
	h := f.handler("slow", WithLease(lease))
	rival := newDeduperOver(t, f.store).mustRegister(t, "slow", WithLease(lease))
	var rivalRuns atomic.Int64
	items := []Item{{Key: "1"}, {Key: "2"}, {Key: "3"}}
	got := h.Run(context.Background(), items, func(ctx context.Context, i int) error {
		time.Sleep(2 * lease)
		// the last item has waited 4 leases for its turn; nobody may take it
		rival.Do(ctx, items[len(items)-1].Key, func(context.Context) error { rivalRuns.Add(1); return nil })
		return nil
	})
	for i, r := range got {
		if r.Outcome != Processed {
			t.Fatalf("item %d: %v %v", i, r.Outcome, r.Err)
		}
	}
	if rivalRuns.Load() != 0 {
		t.Fatalf("a rival ran a claimed item %d times", rivalRuns.Load())
	}
}

func TestBatchClaimsInOneRoundTripAndCompletesAsFnsReturn(t *testing.T) {
	for name, mk := range countedRedis(t) {
		t.Run(name, func(t *testing.T) {
			s, tc, prefix := mk(t)
			d, err := New(s, WithPrefix(prefix), WithLogger(quiet))
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			h, _ := d.Register("orders")
			ctx := context.Background()
			h.Run(ctx, []Item{{Key: "warm"}, {Key: "warm-2"}}, func(context.Context, int) error { return nil }) // load the batch scripts (a batch of one is a single call)
			items := make([]Item, 64)
			for i := range items {
				items[i] = Item{Key: fmt.Sprint("order-", i)}
			}
			tc.Reset()
			for i, r := range h.Run(ctx, items, func(context.Context, int) error { return nil }) {
				if r.Outcome != Processed {
					t.Fatalf("item %d: %v %v", i, r.Outcome, r.Err)
				}
			}
			// the claims in one round trip (a SET NX PX GET each: the keys are free);
			// the completions as the fns return, coalesced: a SET PX of DONE each, no
			// script
			if tc.Trips() < 2 || tc.Cmds() != 64+64 || !strings.HasPrefix(tc.String(), "set×64, set×") || strings.Contains(tc.String(), "eval") {
				t.Fatalf("HandleBatch of 64: %d round trips carrying %d commands (%s), want the claims in the first, then a SET per completion",
					tc.Trips(), tc.Cmds(), tc)
			}
		})
	}
}
