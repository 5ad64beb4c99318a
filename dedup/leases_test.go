package dedup

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// leaseGoroutines counts the goroutines running h's lease table.
func leaseGoroutines(h *Handler) int {
	buf := make([]byte, 1<<22)
	n := runtime.Stack(buf, true)
	return strings.Count(string(buf[:n]), fmt.Sprintf("(*leases).run(%p", &h.leases))
}

// A handler's claims, single calls' and batch items' alike, are extended by one
// goroutine, its lease table's, which stops once the table is empty, and with Close.
func TestOneGoroutineExtendsEveryClaimOfAHandler(t *testing.T) {
	f := newFixture(t, true)
	lease := 60 * time.Millisecond
	h := f.handler("slow", WithLease(lease))
	release := make(chan struct{})
	started := make(chan struct{}, 20)
	slow := func(ctx context.Context) error {
		started <- struct{}{}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	var wg sync.WaitGroup
	results := make([]Outcome, 11)
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, _ := h.Do(context.Background(), "k"+string(rune('a'+i)), slow)
			results[i] = res.Outcome
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		items := []Item{{Key: "b1"}, {Key: "b2"}}
		rs := h.Run(context.Background(), items, func(ctx context.Context, _ int) error { return slow(ctx) }, Parallel(2))
		results[10] = rs[0].Outcome
		if rs[1].Outcome != Processed {
			results[10] = rs[1].Outcome
		}
	}()
	for range 12 {
		<-started
	}
	time.Sleep(3 * lease) // extended several times over
	if n := leaseGoroutines(h); n != 1 {
		t.Errorf("%d lease goroutines for 12 running claims of one handler, want 1", n)
	}
	if n := f.store.extendEntries.Load(); n < 12 {
		t.Errorf("%d extensions of 12 claims over 3 leases", n)
	}
	// the claims due at a tick go in one call (the table's own step, run here on all
	// of them at once, so that no timing decides how many are due together)
	h.leases.mu.Lock()
	var due []*batchItem
	for b := range h.leases.live {
		due = append(due, b)
	}
	h.leases.mu.Unlock()
	calls, entries := f.store.extends.Load(), f.store.extendEntries.Load()
	h.leases.extendAll(due)
	if c, e := f.store.extends.Load()-calls, f.store.extendEntries.Load()-entries; len(due) < 2 || c > 1+(e-int64(len(due))) {
		t.Errorf("%d due claims extended in %d calls carrying %d entries, want one call", len(due), c, e)
	}
	close(release)
	wg.Wait()
	for i, o := range results {
		if o != Processed {
			t.Errorf("run %d: %v, want Processed", i, o)
		}
	}
	// an empty table stops its goroutine at the next tick
	waitFor(t, "the lease goroutine ends with no claim", func() (bool, string) {
		n := leaseGoroutines(h)
		return n == 0, fmt.Sprintf("%d running", n)
	})

	// and Close stops it while a claim is held (its fn runs until Close cancels it;
	// a lease of a second, so that a loaded machine cannot lose it meanwhile)
	long := f.handler("long", WithLease(time.Second))
	go long.Do(context.Background(), "late", func(ctx context.Context) error {
		started <- struct{}{}
		<-ctx.Done()
		return context.Cause(ctx)
	})
	<-started
	// started by the claim, before fn runs, but maybe not scheduled yet: a goroutine
	// that has not run shows no arguments in a stack dump
	waitFor(t, "one lease goroutine for a running claim", func() (bool, string) {
		n := leaseGoroutines(long)
		return n == 1, fmt.Sprintf("%d running", n)
	})
	f.d.Close()
	if n := leaseGoroutines(long); n != 0 {
		t.Errorf("%d lease goroutines after Close, want 0", n)
	}
}
