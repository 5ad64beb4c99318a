package dedup

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/memstore"
)

// slowFirstComplete holds the first completion (Complete or CompleteMany) until its
// deadline.
type slowFirstComplete struct {
	driver.Store
	n atomic.Int64
}

func (s *slowFirstComplete) hang(ctx context.Context) bool {
	if s.n.Add(1) == 1 { // a hung connection: no answer before the call's deadline
		<-ctx.Done()
		return true
	}
	return false
}

func (s *slowFirstComplete) Complete(ctx context.Context, e []driver.Entry) ([]error, error) {
	if s.hang(ctx) {
		return nil, ctx.Err()
	}
	return s.Store.Complete(ctx, e)
}

// An item whose fn succeeds while an earlier item's completion is out (here one that
// hangs until its deadline) has its own completion sent at once, not behind that one:
// it is DONE, and answered (acked), while the other still waits. Otherwise a crash
// meanwhile would run it again, and its claim would wait without a heartbeat, so that
// another process could claim and run it once the lease ran out.
func TestBatchCompletionIsNotHeldBehindAnother(t *testing.T) {
	for _, parallel := range []int{1, 2} {
		t.Run(fmt.Sprint("parallel=", parallel), func(t *testing.T) {
			mem, _ := memstore.New()
			st := &slowFirstComplete{Store: mem}
			h := newDeduperOver(t, st).mustRegister(t, "q", WithLease(300*time.Millisecond))
			d2, _ := New(mem, WithLogger(quiet)) // another process
			defer d2.Close()
			h2, _ := d2.Register("q", WithLease(300*time.Millisecond))

			var runs atomic.Int64
			var mu sync.Mutex
			var order []int
			bDone := make(chan struct{})
			res := h.Run(context.Background(), []Item{{Key: "a"}, {Key: "b"}}, func(ctx context.Context, i int) error {
				if i == 1 {
					time.Sleep(20 * time.Millisecond)
					runs.Add(1)
				}
				return nil
			}, Parallel(parallel), OnResult(func(i int, r ItemResult) {
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
				if i == 1 {
					close(bDone)
					// another process's copy of b, while a's completion still hangs
					if r, _ := h2.Do(context.Background(), "b", func(context.Context) error { runs.Add(1); return nil }); r.Outcome != Duplicate {
						t.Errorf("another process's copy of b: %v, want Duplicate", r.Outcome)
					}
				}
			}))
			t.Logf("a: %v %v; b: %v; results in order %v; b's fn ran %d times", res[0].Outcome, res[0].Err, res[1].Outcome, order, runs.Load())
			if res[1].Outcome != Processed || runs.Load() != 1 {
				t.Errorf("b: %v, its fn ran %d times; want Processed, once", res[1].Outcome, runs.Load())
			}
			if len(order) != 2 || order[0] != 1 {
				t.Errorf("results in order %v: b's waited for a's hung completion", order)
			}
		})
	}
}

// Two batches whose keys cross ([x y] and [y x], at once): each item that waits for
// the other batch's run of its key goes on as soon as that run is over, since each
// batch leaves a key's flight once its result is final, not when all its items are
// done. They used to wait for each other for a whole lease, and then answer
// InProgress for keys already processed.
func TestBatchesWithCrossedKeysDoNotWaitForEachOther(t *testing.T) {
	mem, _ := memstore.New()
	h := newDeduperOver(t, mem).mustRegister(t, "x", WithLease(2*time.Second))
	ctx := WaitForRunning(context.Background())
	fn := func(context.Context, int) error { return nil }
	for it := range 300 {
		x, y := "x"+string(rune('A'+it%26))+time.Now().String(), "y"+time.Now().String()
		var wg sync.WaitGroup
		var ra, rb []ItemResult
		start := make(chan struct{})
		wg.Add(2)
		t0 := time.Now()
		go func() {
			defer wg.Done()
			<-start
			ra = h.Run(ctx, []Item{{Key: x}, {Key: y}}, fn, Parallel(2))
		}()
		go func() {
			defer wg.Done()
			<-start
			rb = h.Run(ctx, []Item{{Key: y}, {Key: x}}, fn, Parallel(2))
		}()
		close(start)
		wg.Wait()
		if el := time.Since(t0); el > 500*time.Millisecond {
			t.Fatalf("iteration %d took %v: A %v/%v, B %v/%v", it, el, ra[0].Outcome, ra[1].Outcome, rb[0].Outcome, rb[1].Outcome)
		}
	}
}

// Crossed batches again, with fingerprints that differ from the DONE records' (no
// local tier): an item that meets another call's flight with another fingerprint
// waits, unbounded, for that flight to be left. That used to be a deadlock.
func TestBatchesWithCrossedKeysAndFingerprintsEnd(t *testing.T) {
	mem, _ := memstore.New()
	h := newDeduperOver(t, mem).mustRegister(t, "fp", WithFingerprint(true), WithLocalCache(0, 0))
	ctx := WaitForRunning(context.Background())
	fn := func(context.Context, int) error { return nil }
	for it := range 200 {
		x, y := "x"+time.Now().String(), "y"+time.Now().String()
		h.Run(ctx, []Item{{Key: x, Payload: []byte("p1")}, {Key: y, Payload: []byte("q1")}}, fn)
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			h.Run(ctx, []Item{{Key: x, Payload: []byte("p1")}, {Key: y, Payload: []byte("q2")}}, fn, Parallel(2))
		}()
		go func() {
			defer wg.Done()
			<-start
			h.Run(ctx, []Item{{Key: y, Payload: []byte("q1")}, {Key: x, Payload: []byte("p2")}}, fn, Parallel(2))
		}()
		close(start)
		ch := make(chan struct{})
		go func() { wg.Wait(); close(ch) }()
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("iteration %d: the two batches wait for each other", it)
		}
	}
}

// An item waiting for another batch's run of its key waits for that run only, not
// for that batch's slowest fn.
func TestBatchJoinerWaitsForTheRunOnly(t *testing.T) {
	mem, _ := memstore.New()
	h := newDeduperOver(t, mem).mustRegister(t, "w", WithLease(time.Second))
	ctx := WaitForRunning(context.Background())
	go h.Run(ctx, []Item{{Key: "x"}, {Key: "z"}}, func(ctx context.Context, i int) error {
		if i == 0 {
			time.Sleep(50 * time.Millisecond)
		} else {
			time.Sleep(3 * time.Second)
		}
		return nil
	}, Parallel(2))
	time.Sleep(10 * time.Millisecond)
	t0 := time.Now()
	res := h.Run(ctx, []Item{{Key: "x"}, {Key: "u"}}, func(context.Context, int) error { return nil }, Parallel(2))
	waited := time.Since(t0)
	t.Logf("x: %v after %v (x's run ended after 50ms)", res[0].Outcome, waited)
	if res[0].Outcome != Duplicate || waited > 2*time.Second {
		t.Errorf("x: %v after %v; want Duplicate once x's run is over, before z's (3s)", res[0].Outcome, waited)
	}
}

type failExtend struct{ driver.Store }

func (failExtend) Extend(context.Context, []driver.Entry) ([]error, error) {
	return nil, errors.New("extend down")
}

// Items of a parallel batch renew their claims on several goroutines at once (for
// the race detector: the batch's no-more-renewals flag is shared).
func TestParallelItemsRenewTheirClaimsConcurrently(t *testing.T) {
	mem, _ := memstore.New()
	h := newDeduperOver(t, failExtend{mem}).mustRegister(t, "r", WithLease(300*time.Millisecond))
	items := []Item{{Key: "a"}, {Key: "b"}, {Key: "c"}, {Key: "d"}}
	res := h.Run(context.Background(), items, func(ctx context.Context, i int) error {
		if i < 2 {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}, Parallel(2))
	for i, r := range res[:2] { // their leases ran out with Extend down
		if r.Outcome != LeaseLost {
			t.Errorf("item %d: %v, %v; want LeaseLost", i, r.Outcome, r.Err)
		}
	}
}

// slowRelease takes 100ms to give a claim back.
type slowRelease struct{ driver.Store }

func (s slowRelease) Release(ctx context.Context, entries []driver.Entry) ([]error, error) {
	time.Sleep(100 * time.Millisecond)
	return s.Store.Release(ctx, entries)
}

// A parallel item whose fn calls runtime.Goexit off the caller's goroutine gives its
// claim back before its result lets a Do waiting for the key go on: that Do then
// claims and runs, rather than meeting the claim and answering InProgress for a lease.
func TestBatchGoexitReleasesBeforeWaitersGoOn(t *testing.T) {
	mem, _ := memstore.New()
	h := newDeduperOver(t, slowRelease{mem}).mustRegister(t, "g", WithLease(5*time.Second))
	ctx := WaitForRunning(context.Background())
	started := make(chan struct{})
	go h.Run(ctx, []Item{{Key: "a"}, {Key: "b"}}, func(_ context.Context, i int) error {
		if i == 0 {
			time.Sleep(300 * time.Millisecond) // keeps the caller's goroutine: b runs on another
			return nil
		}
		close(started)
		time.Sleep(50 * time.Millisecond)
		runtime.Goexit()
		return nil
	}, Parallel(2))
	<-started
	ran := false
	res, err := h.Do(ctx, "b", func(context.Context) error { ran = true; return nil })
	if !ran || res.Outcome != Processed {
		t.Errorf("Do(b) after the batch's b ended by Goexit: %v, %v (RetryAfter %v); want it run, Processed", res.Outcome, err, res.RetryAfter)
	}
}

// claimDown fails every Claim.
type claimDown struct{ driver.Store }

func (claimDown) Claim(context.Context, []driver.Entry) ([]driver.Answer, error) {
	return nil, errors.New("down")
}

// WhenChecked's f comes before the fns also when the claims failed and the items run
// unguarded (FailOpen).
func TestWhenCheckedRunsBeforeUnguardedFns(t *testing.T) {
	mem, _ := memstore.New()
	h := newDeduperOver(t, claimDown{mem}).mustRegister(t, "c", WithStoreFailure(FailOpen))
	var called, calls atomic.Int64
	ctx := WhenChecked(context.Background(), func() { calls.Add(1) })
	var before atomic.Int64
	res := h.Run(ctx, []Item{{Key: "a"}, {Key: "b"}}, func(context.Context, int) error {
		if calls.Load() == 0 {
			before.Add(1)
		}
		called.Add(1)
		return nil
	}, Parallel(4))
	if before.Load() > 0 || calls.Load() != 1 || called.Load() != 2 {
		t.Errorf("%d of %d fns ran before f, f called %d times; want none before, once", before.Load(), called.Load(), calls.Load())
	}
	for i, r := range res {
		if r.Outcome != Processed || !r.Unguarded {
			t.Errorf("item %d: %+v, want Processed unguarded", i, r)
		}
	}
}
