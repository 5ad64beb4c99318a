package dedup

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"
)

// In ModeFilter, HandleBatchParallel marks the batch with one round trip and then runs
// the items' fns at once: eight fns that each wait for all eight to have started
// would deadlock one at a time.
func TestHandleBatchParallelRunsFilterItemsAtOnce(t *testing.T) {
	mem, _ := NewMemoryStore()
	hs := &hookStore{Store: mem}
	d, _ := New(hs, WithLogger(quiet))
	defer d.Close()
	h, _ := d.Register("par", WithMode(ModeFilter))
	const n = 8
	items := make([]Item, n+1)
	for i := range n {
		items[i] = Item{Key: string(rune('a' + i))}
	}
	items[n] = Item{Key: "a"} // a repeat within the batch: a duplicate, not a ninth run
	var started sync.WaitGroup
	started.Add(n)
	all := make(chan struct{})
	go func() { started.Wait(); close(all) }()
	var mu sync.Mutex
	ran := map[int]int{}
	done := make(chan []ItemResult, 1)
	go func() {
		done <- h.HandleBatchParallel(context.Background(), items, n, func(ctx context.Context, i int) error {
			mu.Lock()
			ran[i]++
			mu.Unlock()
			started.Done()
			select {
			case <-all:
				return nil
			case <-time.After(10 * time.Second):
				return errors.New("the other fns never started")
			}
		})
	}()
	var res []ItemResult
	select {
	case res = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("HandleBatchParallel did not return: its fns ran one at a time")
	}
	for i := range n {
		if res[i].Outcome != Processed || res[i].Err != nil || ran[i] != 1 {
			t.Errorf("item %d: %v, %v, ran %d times; want Processed once", i, res[i].Outcome, res[i].Err, ran[i])
		}
	}
	if res[n].Outcome != Duplicate || ran[n] != 0 {
		t.Errorf("repeated key: %v, ran %d times; want Duplicate, unrun", res[n].Outcome, ran[n])
	}
	if m, b := hs.marks.Load(), hs.batches.Load(); m != 0 || b != 1 {
		t.Errorf("%d single marks and %d batch calls, want 0 and 1 (MarkMany)", m, b)
	}
}

// An fn that calls runtime.Goexit on the caller's goroutine ends the call, as in
// HandleBatch, without leaving the Deduper unable to Close; one that does so on a
// goroutine of the batch's own is reported as Panicked, wrapping ErrPanic.
func TestHandleBatchParallelGoexit(t *testing.T) {
	mem, _ := NewMemoryStore()
	d, _ := New(mem, WithLogger(quiet))
	h, _ := d.Register("par-goexit", WithMode(ModeFilter))
	exited := make(chan struct{})
	returned := false
	go func() {
		defer close(exited)
		h.HandleBatchParallel(context.Background(), []Item{{Key: "a"}, {Key: "b"}}, 2, func(ctx context.Context, i int) error {
			runtime.Goexit()
			return nil
		})
		returned = true
	}()
	<-exited
	if returned {
		t.Error("HandleBatchParallel returned after its fn ended the caller's goroutine")
	}
	// a slow first item lets the others start on goroutines of their own
	res := h.HandleBatchParallel(context.Background(), []Item{{Key: "c"}, {Key: "d"}, {Key: "e"}}, 3, func(ctx context.Context, i int) error {
		switch i {
		case 0:
			time.Sleep(50 * time.Millisecond)
		case 1, 2:
			runtime.Goexit()
		}
		return nil
	})
	if res[0].Outcome != Processed {
		t.Errorf("item c: %v, want Processed", res[0].Outcome)
	}
	for i := 1; i < 3; i++ {
		if res[i].Outcome != Panicked || !errors.Is(res[i].Err, ErrPanic) {
			t.Errorf("item %d: %v, %v; want Panicked wrapping ErrPanic", i, res[i].Outcome, res[i].Err)
		}
	}
	closed := make(chan struct{})
	go func() { d.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close still blocked after the Goexits")
	}
}

// Fns that end within spawnAfter run on the caller's goroutine, one after the other:
// no goroutine each.
func TestHandleBatchParallelFastFnsStayOnTheCaller(t *testing.T) {
	mem, _ := NewMemoryStore()
	d, _ := New(mem, WithLogger(quiet))
	defer d.Close()
	h, _ := d.Register("par-fast", WithMode(ModeFilter))
	// however slow the machine, they are "fast" here: only the wait decides
	defer func(d time.Duration) { spawnAfter = d }(spawnAfter)
	spawnAfter = time.Hour
	items := make([]Item, 50)
	for i := range items {
		items[i] = Item{Key: fmt.Sprint("k", i)}
	}
	caller := goid()
	others := 0
	h.HandleBatchParallel(context.Background(), items, len(items), func(ctx context.Context, i int) error {
		if goid() != caller {
			others++ // only the caller's goroutine runs them: no race
		}
		return nil
	})
	if others != 0 {
		t.Errorf("%d of %d fast fns ran off the caller's goroutine", others, len(items))
	}
}
