package dedup

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/memstore"
)

// A signal releases the callers that waited before it fired and those that come
// after, made their channels concurrently with fire; a second fire panics, as a
// second close of a channel does.
func TestSignalReleasesEveryWaiter(t *testing.T) {
	for range 200 {
		var s signal
		const waiters = 8
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range waiters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				select {
				case <-s.done():
				case <-time.After(10 * time.Second):
					t.Error("a waiter was never released")
				}
			}()
		}
		close(start)
		s.fire()
		wg.Wait()
		select {
		case <-s.done():
		default:
			t.Fatal("done after fire: not closed")
		}
	}
	func() {
		var s signal
		s.fire()
		defer func() {
			if recover() == nil {
				t.Error("a second fire did not panic")
			}
		}()
		s.fire()
	}()
	var s signal
	if s.done() != s.done() {
		t.Fatal("two waiters before fire got different channels")
	}
	select {
	case <-s.done():
		t.Fatal("closed before fire")
	default:
	}
}

// A flight that nobody waits for costs one allocation, the flight: its signals make
// no channel.
func TestFlightWithoutWaitersAllocatesOnlyItself(t *testing.T) {
	fs := newFlights()
	allocs := testing.AllocsPerRun(200, func() {
		f, lead := fs.join("k", 0)
		if !lead {
			t.Fatal("not the leader of a free key")
		}
		f.answer(Result{Outcome: First}, nil, false)
		fs.leave("k", f)
	})
	if allocs > 1 {
		t.Fatalf("%v allocations per flight, want 1", allocs)
	}
}

// The fns of a filter batch share one context for the batch, and it still ends with
// ErrClosed when the Deduper closes while they run.
func TestFilterBatchFnsSeeErrClosedWhenTheDeduperCloses(t *testing.T) {
	mem, _ := memstore.New()
	dd := newDeduperOver(t, mem)
	h := dd.mustRegister(t, "close-batch", WithMode(ModeFilter))
	started := make(chan struct{}, 2)
	causes := make([]error, 2)
	done := make(chan []ItemResult)
	go func() {
		done <- h.Run(context.Background(), []Item{{Key: "a"}, {Key: "b"}}, func(ctx context.Context, i int) error {
			started <- struct{}{}
			select {
			case <-ctx.Done():
				causes[i] = context.Cause(ctx)
			case <-time.After(10 * time.Second):
				causes[i] = errors.New("never cancelled")
			}
			return ctx.Err()
		}, Parallel(2))
	}()
	<-started
	<-started
	if err := dd.Close(); err != nil {
		t.Fatal(err)
	}
	res := <-done
	for i, r := range res {
		if !errors.Is(causes[i], ErrClosed) {
			t.Errorf("item %d: fn's context ended with %v, want ErrClosed", i, causes[i])
		}
		if r.Outcome != Failed { // marked DONE already: a redelivery would be a duplicate
			t.Errorf("item %d: %v, want Failed", i, r.Outcome)
		}
	}
}

// A filter batch of fresh keys costs few allocations per item: one flight, one
// token, one record key, one local-tier node, the memory store's record, and the
// batch's share of its own. The fns share one context (14 per item before).
func TestFilterBatchAllocatesAFewObjectsPerItem(t *testing.T) {
	mem, _ := memstore.New()
	h := newDeduperOver(t, mem).mustRegister(t, "allocs", WithMode(ModeFilter))
	const n = 64
	items := make([]Item, n)
	keys := make([]string, 0, 101*n)
	for i := range cap(keys) {
		keys = append(keys, "key-"+strconv.Itoa(i))
	}
	next := 0
	fn := func(context.Context, int) error { return nil }
	perBatch := testing.AllocsPerRun(100, func() {
		for j := range items {
			items[j] = Item{Key: keys[next]}
			next++
		}
		h.Run(context.Background(), items, fn, Parallel(1))
	})
	if per := perBatch / n; per > 8 {
		t.Fatalf("%.1f allocations per item, want at most 8", per)
	}
}

// A Mark (or filter-mode HandleKey) the local tier answers takes no part in Close, as
// a Do's does not: while Close waits for a running fn, a key known DONE is still a
// Duplicate, a new key is refused. The local answers are counted in Stats from their stripes.
func TestLocalTierStillAnswersMarksDuringClose(t *testing.T) {
	f := newFixture(t, true)
	h := f.handler("orders", WithMode(ModeFilter))
	ctx := context.Background()
	if res, err := h.Mark(ctx, "seen"); err != nil || res.Outcome != First {
		t.Fatalf("first Mark: %v %v", res.Outcome, err)
	}
	const hits = 100
	for range hits {
		if res, err := h.Mark(ctx, "seen"); err != nil || res.Outcome != Duplicate || res.Tier != TierLocal {
			t.Fatalf("Mark of a marked key: %v/%v %v, want a local Duplicate", res.Outcome, res.Tier, err)
		}
	}
	if st := h.Stats(); st.Count(Duplicate) != hits || st.LocalDuplicates != hits || st.Count(First) != 1 {
		t.Fatalf("stats: %d duplicates, %d local, %d first; want %d, %d, 1", st.Count(Duplicate), st.LocalDuplicates, st.Count(First), hits, hits)
	}

	payload := []byte(`{"order":1}`)
	if res, err := handleKey(h, ctx, "handled", payload, ok); err != nil || res.Outcome != Processed {
		t.Fatalf("first HandleKey: %v %v", res.Outcome, err)
	}

	running, release := make(chan struct{}), make(chan struct{})
	go h.Do(ctx, "slow", func(context.Context) error {
		close(running)
		<-release
		return nil
	})
	<-running
	closed := make(chan error)
	go func() { closed <- f.d.Close() }()
	for !f.d.isClosing() {
		time.Sleep(time.Millisecond)
	}
	if res, err := h.Mark(ctx, "seen"); err != nil || res.Outcome != Duplicate {
		t.Errorf("Mark of a marked key while Close waits: %v %v, want Duplicate", res.Outcome, err)
	}
	ran := false
	if res, err := handleKey(h, ctx, "handled", payload, func(context.Context) error { ran = true; return nil }); err != nil || res.Outcome != Duplicate || ran {
		t.Errorf("HandleKey of a handled key while Close waits: %v %v (fn ran: %v), want Duplicate", res.Outcome, err, ran)
	}
	if res, err := h.Mark(ctx, "new"); !errors.Is(err, ErrClosed) || res.Outcome != Cancelled {
		t.Errorf("Mark of a new key while Close waits: %v %v, want Cancelled, ErrClosed", res.Outcome, err)
	}
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}

// isClosing reports whether Close has begun.
func (d *Deduper) isClosing() bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.closed
}
