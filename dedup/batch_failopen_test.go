package dedup

// Batches under FailOpen: unguarded runs come after the claimed ones, and a nested
// Goexit in one of them ends it and lets Close return.

import (
	"context"
	"fmt"
	"reflect"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/memstore"
)

func failOpenPair(t *testing.T, lease time.Duration) (*Deduper, *Handler, *memstore.Store) {
	mem, _ := memstore.New()
	d0, _ := New(mem, WithLogger(quiet))
	h0, _ := d0.Register("rv")
	bad := h0.RecordKey("a")
	d0.Close()
	d, _ := New(itemErrStore{mem, bad}, WithLogger(quiet))
	h, _ := d.Register("rv", WithLease(lease), WithStoreFailure(FailOpen), WithLocalCache(0, 0))
	return d, h, mem
}

// a claimed item's fn calls Goexit; the deferred fail-open item still runs fn,
// inside the exiting goroutine, after the claims were given back.
func TestBatchGoexitLeavesFailOpenItemsUnrun(t *testing.T) {
	d, h, _ := failOpenPair(t, time.Second)
	defer d.Close()
	var ranA atomic.Int32
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		h.Run(context.Background(), []Item{{Key: "a"}, {Key: "b"}}, func(ctx context.Context, i int) error {
			if i == 1 {
				runtime.Goexit()
			}
			ranA.Add(1)
			return nil
		})
	}()
	<-ch
	if ranA.Load() != 0 {
		t.Errorf("fn for the fail-open item ran %d time(s) after another item's fn called Goexit (claimed items were released unrun; no result reaches the caller)", ranA.Load())
	}
}

// the fail-open item's flight is left unanswered while the claimed items run:
// a concurrent Do for its key blocks instead of answering InProgress.
func TestBatchFailOpenFlightAnswersWaiters(t *testing.T) {
	d, h, _ := failOpenPair(t, time.Second)
	defer d.Close()
	var got Result
	var took time.Duration
	h.Run(context.Background(), []Item{{Key: "a"}, {Key: "b"}}, func(ctx context.Context, i int) error {
		if i == 1 {
			c, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			s := time.Now()
			got, _ = h.Do(c, "a", func(context.Context) error { return nil })
			took = time.Since(s)
		}
		return nil
	})
	if got.Outcome != InProgress {
		t.Errorf("Do(a) from inside the batch: %v after %v, want InProgress at once (without a deadline: deadlock)", got.Outcome, took)
	}
}

// Close while a claimed item runs: remaining claimed items are left unrun, but
// the deferred fail-open item's fn is still invoked after Close.
func TestBatchFailOpenItemNotRunAfterClose(t *testing.T) {
	d, h, _ := failOpenPair(t, time.Second)
	var aAfterClose atomic.Bool
	closed := make(chan struct{})
	h.Run(context.Background(), []Item{{Key: "a"}, {Key: "b"}, {Key: "c"}}, func(ctx context.Context, i int) error {
		switch i {
		case 1:
			go func() { d.Close(); close(closed) }()
			<-ctx.Done()
			return ctx.Err()
		case 0:
			select {
			case <-h.d.ctx.Done():
				aAfterClose.Store(true)
			default:
			}
		}
		return nil
	})
	<-closed
	if aAfterClose.Load() {
		t.Errorf("fn for the fail-open item was invoked after Close began (claimed item c was not)")
	}
}

func children(ctx context.Context) int {
	v := reflect.ValueOf(ctx).Elem().FieldByName("children")
	return v.Len()
}

// Goexit in a batch fn leaks fn's context (never cancelled) and its AfterFunc on d.ctx.
func TestBatchGoexitReleasesContexts(t *testing.T) {
	mem, _ := memstore.New()
	d, _ := New(mem, WithLogger(quiet))
	defer d.Close()
	h, _ := d.Register("lk", WithLocalCache(0, 0))
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	for n := 0; n < 50; n++ {
		ch := make(chan struct{})
		go func() {
			defer close(ch)
			h.Run(parent, []Item{{Key: "k" + string(rune('A'+n))}}, func(ctx context.Context, i int) error { runtime.Goexit(); return nil })
		}()
		<-ch
	}
	if c := children(parent); c != 0 {
		t.Errorf("parent ctx holds %d live children after 50 Goexit batches; d.ctx holds %d", c, children(d.ctx))
	}
}

// nested Goexit in the deferred fail-open run: goroutine ends, Close returns.
func TestNestedGoexitInAFailOpenRunEndsAndCloseReturns(t *testing.T) {
	d, h, _ := failOpenPair(t, time.Second)
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		h.Run(context.Background(), []Item{{Key: "a"}, {Key: "b"}}, func(ctx context.Context, i int) error {
			runtime.Goexit()
			return nil
		})
	}()
	select {
	case <-ch:
	case <-time.After(2 * time.Second):
		t.Fatal("batch goroutine did not end")
	}
	c := make(chan struct{})
	go func() { d.Close(); close(c) }()
	select {
	case <-c:
	case <-time.After(3 * time.Second):
		t.Fatal("Close hangs")
	}
	// is a's flight gone?
	r, _ := h.Do(context.Background(), "b", func(context.Context) error { return nil })
	t.Logf("after: %v", r.Outcome)
}

// In filter mode, every item's flight is answered before any fn runs: an fn that
// marks a later key of its own batch gets its answer at once instead of waiting for
// that key's turn (or forever).
func TestBatchFilterAnswersEveryFlightFirst(t *testing.T) {
	f := newFixture(t, false)
	h := f.handler("views", WithMode(ModeFilter))
	var inner Result
	got := h.Run(context.Background(), []Item{{Key: "a"}, {Key: "b"}}, func(ctx context.Context, i int) error {
		if i == 0 {
			ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			inner, _ = h.Mark(ctx, "b")
		}
		return nil
	})
	if inner.Outcome != Duplicate {
		t.Fatalf("Mark of a key the batch had marked: %v, want duplicate", inner.Outcome)
	}
	if got[0].Outcome != Processed || got[1].Outcome != Processed {
		t.Fatalf("batch: %v %v", got[0].Outcome, got[1].Outcome)
	}
}

// In filter mode an fn cancelled by its caller is Failed when the mark wrote DONE (its
// redelivery would be a duplicate), and Cancelled when the mark failed and fn ran
// unguarded under FailOpen (nothing was written): for one key and in a batch alike.
func TestFilterCancelledFnIsFailedOnlyWhenMarked(t *testing.T) {
	for _, down := range []bool{false, true} {
		f := newFixture(t, true)
		h := f.handler(fmt.Sprint("filter-", down), WithMode(ModeFilter), WithStoreFailure(FailOpen), WithLocalCache(0, 0))
		if down {
			f.store.onFail(func(string) error { return fmt.Errorf("%w: connection refused", ErrStoreUnavailable) })
		}
		want := Failed
		if down {
			want = Cancelled
		}
		cancelled := func(cancel context.CancelFunc) func(context.Context, int) error {
			return func(ctx context.Context, _ int) error {
				cancel()
				return ctx.Err()
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		one := h.Run(ctx, []Item{{Key: "one"}}, cancelled(cancel)) // a single call
		ctx, cancel = context.WithCancel(context.Background())
		batch := h.Run(ctx, []Item{{Key: "a"}, {Key: "b"}}, cancelled(cancel))
		for _, r := range []ItemResult{one[0], batch[0]} {
			if r.Outcome != want || r.Unguarded != down {
				t.Errorf("store down %v: %v (unguarded %v), %v; want %v", down, r.Outcome, r.Unguarded, r.Err, want)
			}
		}
	}
}
