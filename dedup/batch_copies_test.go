package dedup

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/keys"
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

// A copy waiting for a run whose fn succeeded but whose DONE record was not written
// (NotRecorded) is a Duplicate, as the design's outcome table has it (running again
// would repeat the effects): whether only the completion failed, or, under FailOpen,
// the store failed after the claim. The copy claimed the key and, under FailOpen, ran
// fn a second time (a review of the change above).
func TestACopyOfANotRecordedRunIsADuplicate(t *testing.T) {
	for _, c := range notRecordedCases {
		t.Run(c.name, func(t *testing.T) {
			hs := notRecordedStore(c.failOp)
			h := newDeduperOver(t, hs).mustRegister(t, "not-recorded", c.opts...)
			var calls atomic.Int32
			res := h.Run(WaitForRunning(context.Background()), []Item{{Key: "k"}, {Key: "k"}}, func(context.Context, int) error {
				calls.Add(1)
				return nil
			}, Parallel(2))
			if res[0].Outcome != NotRecorded || res[1].Outcome != Duplicate || calls.Load() != 1 {
				t.Fatalf("outcomes %v, %v; fn ran %d times; want not-recorded, duplicate and 1", res[0].Outcome, res[1].Outcome, calls.Load())
			}
		})
	}
}

// A copy that runs because the first run of its key failed runs once the batch's own
// fns have: Parallel(n) still bounds the fns of the Run (a review of the change
// above: a copy joining the first copy's flight ran beside them, 3 at once for n = 2).
func TestACopysRunKeepsToParallel(t *testing.T) {
	mem, _ := memstore.New()
	h := newDeduperOver(t, mem).mustRegister(t, "copies-parallel")
	var cur, peak, calls atomic.Int32
	items := []Item{{Key: "a"}, {Key: "a"}, {Key: "b"}, {Key: "c"}}
	res := h.Run(WaitForRunning(context.Background()), items, func(_ context.Context, i int) error {
		n := cur.Add(1)
		defer cur.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		calls.Add(1)
		if i == 0 {
			return errors.New("the first run of a fails")
		}
		time.Sleep(50 * time.Millisecond)
		return nil
	}, Parallel(2))
	want := []Outcome{Failed, Processed, Processed, Processed}
	for i, r := range res {
		if r.Outcome != want[i] {
			t.Fatalf("item %d: %v, want %v", i, r.Outcome, want[i])
		}
	}
	if peak.Load() > 2 || calls.Load() != 4 {
		t.Fatalf("%d fns at once (Parallel(2)), %d runs; want at most 2, and 4", peak.Load(), calls.Load())
	}
}

// A copy in another call that waits (WaitForRunning) for a run whose fn succeeded but
// whose DONE was not written (NotRecorded) is a Duplicate, as a copy in the same batch
// is: it claimed the key again and got InProgress from the run's claim, and, under
// FailOpen with the store down, ran fn a second time.
func TestAWaiterOfANotRecordedRunIsADuplicate(t *testing.T) {
	for _, c := range notRecordedCases {
		t.Run(c.name, func(t *testing.T) {
			hs := notRecordedStore(c.failOp)
			h := newDeduperOver(t, hs).mustRegister(t, "waiter", c.opts...)
			var calls atomic.Int32
			inside, release := make(chan struct{}), make(chan struct{})
			first := make(chan Result, 1)
			go func() {
				r, _ := h.Do(context.Background(), "k", func(context.Context) error {
					calls.Add(1)
					close(inside)
					<-release
					return nil
				})
				first <- r
			}()
			<-inside
			copied := make(chan Result, 1)
			go func() {
				r, _ := h.Do(WaitForRunning(context.Background()), "k", func(context.Context) error { calls.Add(1); return nil })
				copied <- r
			}()
			waitForAWaiter(t, h, "k")
			close(release)
			if r := <-first; r.Outcome != NotRecorded {
				t.Fatalf("the run: %v, want not-recorded", r.Outcome)
			}
			if r := <-copied; r.Outcome != Duplicate || calls.Load() != 1 {
				t.Fatalf("the copy: %v, fn ran %d times; want duplicate and 1", r.Outcome, calls.Load())
			}
		})
	}
}

// A waiter on a handler WithReplies whose run ended NotRecorded does not take a
// Duplicate without the reply: the reply was not stored, so it is InProgress while
// the run's claim holds (a retryable 503, not a final 409), as before the change
// above (a review of it).
func TestAReplyWaiterOfANotRecordedRunIsNotAReplylessDuplicate(t *testing.T) {
	mem, _ := memstore.New()
	hs := &hookStore{Store: mem}
	hs.onFail(func(op string) error {
		if op == "complete-reply" || op == "complete-many" {
			return errors.New("store down")
		}
		return nil
	})
	h := newDeduperOver(t, hs).mustRegister(t, "reply-waiter", WithReplies(64))
	inside, release := make(chan struct{}), make(chan struct{})
	first := make(chan ItemResult, 1)
	go func() {
		r, _ := runReply(h, context.Background(), "k", nil, func(context.Context) ([]byte, error) {
			close(inside)
			<-release
			return []byte("hello"), nil
		})
		first <- r
	}()
	<-inside
	copied := make(chan ItemResult, 1)
	go func() {
		r, _ := runReply(h, WaitForRunning(context.Background()), "k", nil, func(context.Context) ([]byte, error) { return []byte("again"), nil })
		copied <- r
	}()
	waitForAWaiter(t, h, "k")
	close(release)
	if r := <-first; r.Outcome != NotRecorded {
		t.Fatalf("the run: %v, want not-recorded", r.Outcome)
	}
	if r := <-copied; r.Outcome != InProgress {
		t.Fatalf("the copy: %v (reply %q, has %v), want in-progress", r.Outcome, r.Reply, r.HasReply)
	}
}

// notRecordedCases are two ways for a run's fn to succeed and its DONE not to be
// written: the completion fails; or, under FailOpen, the store fails after the claim.
var notRecordedCases = []struct {
	name   string
	opts   []HandlerOption
	failOp func(op string, claims int32) bool
}{
	{"the completion fails", nil, func(op string, _ int32) bool { return op == "complete" || op == "complete-many" }},
	{"the store fails after the claim, FailOpen", []HandlerOption{WithStoreFailure(FailOpen)},
		func(op string, claims int32) bool { return !(op == "claim" || op == "claim-many") || claims > 1 }},
}

// notRecordedStore is a memory store whose calls fail where failOp says so, given
// the claim calls made so far.
func notRecordedStore(failOp func(op string, claims int32) bool) *hookStore {
	mem, _ := memstore.New()
	hs := &hookStore{Store: mem}
	var claims atomic.Int32
	hs.onFail(func(op string) error {
		if op == "claim" || op == "claim-many" {
			claims.Add(1)
		}
		if failOp(op, claims.Load()) {
			return errors.New("store down")
		}
		return nil
	})
	return hs
}

// waitForAWaiter returns once a call waits for the end of h's run of key: it has
// asked for the flight's end signal.
func waitForAWaiter(t *testing.T, h *Handler, key string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if f := h.flights.lookup(keys.Normalize(key)); f != nil && f.left.p.Load() != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the copy never waited for the run")
		}
		time.Sleep(time.Millisecond)
	}
}
