package dedup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// HandleBatchParallel checks the batch with one round trip and then runs the items'
// fns at once: eight fns that each wait for all eight to have started would deadlock
// one at a time. In ModeDo the claims are one ClaimMany and the completions go in
// CompleteMany calls, never one by one.
func TestParallelRunRunsItemsAtOnce(t *testing.T) {
	t.Run("filter", func(t *testing.T) { testParallelRunRunsItemsAtOnce(t, ModeFilter) })
	t.Run("do", func(t *testing.T) { testParallelRunRunsItemsAtOnce(t, ModeDo) })
}

func testParallelRunRunsItemsAtOnce(t *testing.T, mode Mode) {
	mem, _ := memstore.New()
	hs := &hookStore{Store: mem}
	h := newDeduperOver(t, hs).mustRegister(t, "par", WithMode(mode))
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
		done <- h.Run(context.Background(), items, func(ctx context.Context, i int) error {
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
		}, Parallel(n))
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
	if checks, completes := hs.marks.Load()+hs.claims.Load(), hs.completes.Load(); checks != 1 || (mode == ModeFilter && completes != 0) || (mode == ModeDo && (completes < 1 || completes > int64(n))) {
		t.Errorf("%d check calls and %d completion calls; want one Mark or one Claim for the batch, and coalesced Completes", checks, completes)
	}
	for i := range n {
		if lk := localKey(items[i].Key, ""); h.local != nil && !h.local.Contains(lk) {
			t.Errorf("item %d is not DONE in the local tier", i)
		}
	}
}

// An fn that calls runtime.Goexit ends its own goroutine only: every item still gets
// a result through done (Panicked, wrapping ErrPanic, for the one that ended), and the
// Deduper can still Close. Whether the caller's goroutine or a helper took it does
// not matter here. In ModeDo the claims of the items that ended are given back.
func TestParallelRunGoexitEndsOnlyItsOwnItem(t *testing.T) {
	t.Run("filter", func(t *testing.T) { testParallelRunGoexitEndsOnlyItsOwnItem(t, ModeFilter) })
	t.Run("do", func(t *testing.T) { testParallelRunGoexitEndsOnlyItsOwnItem(t, ModeDo) })
}

func testParallelRunGoexitEndsOnlyItsOwnItem(t *testing.T, mode Mode) {
	mem, _ := memstore.New()
	d, _ := New(mem, WithLogger(quiet))
	h, _ := d.Register("par-goexit", WithMode(mode))
	started := make(chan struct{}, 2)
	got, _ := batchOnItsOwn(h, []Item{{Key: "c"}, {Key: "d"}, {Key: "e"}}, 3, func(ctx context.Context, i int) error {
		if i == 0 { // holds its goroutine until the other two have started elsewhere
			for range 2 {
				select {
				case <-started:
				case <-time.After(10 * time.Second):
					return errors.New("the other items never started")
				}
			}
			return nil
		}
		started <- struct{}{}
		runtime.Goexit()
		return nil
	})
	if len(got) != 3 {
		t.Fatalf("done was called for %d of 3 items", len(got))
	}
	if got[0].Outcome != Processed {
		t.Errorf("item c: %v, %v; want Processed", got[0].Outcome, got[0].Err)
	}
	for i := 1; i < 3; i++ {
		if got[i].Outcome != Panicked || !errors.Is(got[i].Err, ErrPanic) {
			t.Errorf("item %d: %v, %v; want Panicked wrapping ErrPanic", i, got[i].Outcome, got[i].Err)
		}
	}
	if mode == ModeDo {
		for _, k := range []string{"d", "e"} { // released in the background: Close waits for it
			testenv.Eventually(t, 10*time.Second, "the claim of "+k+" given back", func() bool {
				a, err := claim1(context.Background(), mem, h.RecordKey(k), "other", "", time.Minute)
				return err == nil && a.Status == driver.StatusAcquired
			})
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

// done reports an item as soon as its own result is final: a fast item's result does
// not wait for a slow one of the same batch. In ModeDo the fast item's claim is
// completed while the slow one runs.
func TestParallelRunReportsEachItemWhenDone(t *testing.T) {
	t.Run("filter", func(t *testing.T) { testParallelRunReportsEachItemWhenDone(t, ModeFilter) })
	t.Run("do", func(t *testing.T) { testParallelRunReportsEachItemWhenDone(t, ModeDo) })
}

func testParallelRunReportsEachItemWhenDone(t *testing.T, mode Mode) {
	mem, _ := memstore.New()
	h := newDeduperOver(t, mem).mustRegister(t, "par-done", WithMode(mode))
	release := make(chan struct{})
	reported := make(chan int, 2)
	go h.Run(context.Background(), []Item{{Key: "slow"}, {Key: "fast"}}, func(ctx context.Context, i int) error {
		if i == 0 {
			<-release
		}
		return nil
	}, Parallel(2), OnResult(func(i int, r ItemResult) {
		if r.Outcome != Processed {
			t.Errorf("item %d: %v, %v; want Processed", i, r.Outcome, r.Err)
		}
		reported <- i
	}))
	select {
	case i := <-reported:
		if i != 1 {
			t.Fatalf("item %d reported first, want the fast one (1)", i)
		}
		if a, err := claim1(context.Background(), mem, h.RecordKey("fast"), "other", "", time.Minute); err != nil || a.Status != driver.StatusDuplicate {
			t.Fatalf("the fast item's record: %+v, %v; want DONE (Duplicate)", a, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the fast item was not reported while the slow one ran")
	}
	close(release)
	if i := <-reported; i != 0 {
		t.Fatalf("item %d reported second, want 0", i)
	}
}

// slowMark holds the first Mark until release, so that a batch meets the key while
// its mark is out; entered says it has begun.
type slowMark struct {
	driver.Store
	entered, release chan struct{}
	once             sync.Once
}

func (s *slowMark) Mark(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	first := false
	s.once.Do(func() { first = true })
	if first {
		close(s.entered)
		<-s.release
	}
	return s.Store.Mark(ctx, entries)
}

// A batch item whose key another call in this process is marking is not answered
// InProgress (a Nak, and a Term on the last delivery), as it once was: the store
// decides between the two marks, and exactly one is First and runs.
func TestBatchItemMeetingAnotherCallsMark(t *testing.T) {
	mem, _ := memstore.New()
	sm := &slowMark{Store: mem, entered: make(chan struct{}), release: make(chan struct{})}
	h := newDeduperOver(t, sm).mustRegister(t, "joined", WithMode(ModeFilter))
	first := make(chan Result, 1)
	go func() {
		r, _ := h.Mark(context.Background(), "x")
		first <- r
	}()
	<-sm.entered // the Mark is out
	time.AfterFunc(100*time.Millisecond, func() { close(sm.release) })
	ran := false
	res := h.Run(context.Background(), []Item{{Key: "x"}}, func(context.Context, int) error {
		ran = true
		return nil
	}, Parallel(2), asBatch)
	lone := (<-first).Outcome
	switch {
	case lone == First && res[0].Outcome == Duplicate && !ran:
	case lone == Duplicate && res[0].Outcome == Processed && ran:
	default:
		t.Errorf("the lone Mark: %v; the batch's copy: %v (ran %v); want one First (Processed), the other Duplicate", lone, res[0].Outcome, ran)
	}
}

// An fn that ends the caller's goroutine (runtime.Goexit) ends the call, and still
// every item gets a result through done: side by side, the items not reached yet run
// on other goroutines; one at a time (or keyless, or following a key earlier in the
// batch), they are Panicked.
func TestParallelRunCallerGoexitStillReportsEveryItem(t *testing.T) {
	// No goroutine joins before the caller's Goexit: with the usual millisecond, a
	// loaded machine could let one take item 0 first, and the Goexit would not be
	// the caller's (seen once in a full go test ./... run).
	defer func(d time.Duration) { spawnAfter = d }(spawnAfter)
	spawnAfter = time.Hour
	mem, _ := memstore.New()
	d, _ := New(mem, WithLogger(quiet), WithPrefix("cg"))
	defer d.Close()
	h, _ := d.Register("caller-goexit", WithMode(ModeFilter), WithMissingKey(ProcessMissingKey))
	run := func(items []Item, parallel int) (map[int]ItemResult, bool) {
		return batchOnItsOwn(h, items, parallel, func(ctx context.Context, i int) error {
			if i == 0 {
				runtime.Goexit() // on the caller's goroutine: item 0 is the first it takes
			}
			return nil
		})
	}
	got, returned := run([]Item{{Key: "p0"}, {Key: "p1"}, {Key: "p2"}}, 3)
	if returned || len(got) != 3 || got[0].Outcome != Panicked || got[1].Outcome != Processed || got[2].Outcome != Processed {
		t.Errorf("side by side: returned %v, results %v; want no return, item 0 Panicked, 1 and 2 Processed", returned, got)
	}
	got, returned = run([]Item{{Key: "s0"}, {Key: "s0"}, {Key: ""}}, 1)
	if returned || len(got) != 3 || got[0].Outcome != Panicked || got[1].Outcome != Panicked || got[2].Outcome != Panicked {
		t.Errorf("one at a time: returned %v, results %v; want no return, all 3 Panicked", returned, got)
	}
}

// A result known early (a local-tier hit) reaches done only once the batch's store
// round trip has answered every other key: done may be slow (an ack), and must not
// hold up the flights that other callers wait on.
func TestParallelRunHoldsEarlyResultsUntilTheRoundTripAnswers(t *testing.T) {
	mem, _ := memstore.New()
	hs := &hookStore{Store: mem}
	h := newDeduperOver(t, hs).mustRegister(t, "early", WithMode(ModeFilter), WithLocalCache(100, time.Hour))
	if r, err := h.Mark(context.Background(), "seen"); err != nil || r.Outcome != First {
		t.Fatalf("mark: %v, %v", r.Outcome, err)
	}
	var marksAtDone int64 = -1
	h.Run(context.Background(), []Item{{Key: "seen"}, {Key: "new"}}, func(context.Context, int) error { return nil }, Parallel(2), OnResult(func(i int, r ItemResult) {
		if i == 0 {
			marksAtDone = hs.marks.Load()
		}
	}))
	if marksAtDone != 2 {
		t.Fatalf("done for the local hit came with %d Mark calls made, want after the batch's (the second)", marksAtDone)
	}
}

// Fns that end within spawnAfter run on the caller's goroutine, one after the other:
// no goroutine each.
func TestParallelRunKeepsFastFnsOnTheCaller(t *testing.T) {
	mem, _ := memstore.New()
	h := newDeduperOver(t, mem).mustRegister(t, "par-fast", WithMode(ModeFilter))
	// however slow the machine, they are "fast" here: only the wait decides
	defer func(d time.Duration) { spawnAfter = d }(spawnAfter)
	spawnAfter = time.Hour
	items := make([]Item, 50)
	for i := range items {
		items[i] = Item{Key: fmt.Sprint("k", i)}
	}
	caller := goid()
	others := 0
	h.Run(context.Background(), items, func(ctx context.Context, i int) error {
		if goid() != caller {
			others++ // only the caller's goroutine runs them: no race
		}
		return nil
	}, Parallel(len(items)))
	if others != 0 {
		t.Errorf("%d of %d fast fns ran off the caller's goroutine", others, len(items))
	}
}

// In a parallel ModeDo batch one heartbeat extends every running claim, and losing
// one lease cancels that item's fn only: the other fn of the batch, running beside
// it, goes on and completes.
func TestParallelRunLeaseLostCancelsItsItemOnly(t *testing.T) {
	mem, _ := memstore.New()
	const lease = 150 * time.Millisecond
	h := newDeduperOver(t, mem).mustRegister(t, "par-lease", WithLease(lease))
	var started sync.WaitGroup
	started.Add(2)
	stolen := make(chan struct{})
	var got [2]ItemResult
	res := h.Run(context.Background(), []Item{{Key: "lost"}, {Key: "kept"}}, func(ctx context.Context, i int) error {
		started.Done()
		if i == 0 {
			started.Wait()
			// another owner takes the key: the next extension finds the lease gone
			if _, err := mem.Forget(context.Background(), []string{h.RecordKey("lost")}, true); err != nil {
				t.Error(err)
			}
			if a, err := claim1(context.Background(), mem, h.RecordKey("lost"), "rival", "", time.Minute); err != nil || a.Status != driver.StatusAcquired {
				t.Errorf("rival claim: %v %v", a.Status, err)
			}
			close(stolen)
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(10 * time.Second):
				return errors.New("never cancelled")
			}
		}
		<-stolen
		time.Sleep(2 * lease) // through several beats, past the other's loss
		return ctx.Err()
	}, Parallel(2), OnResult(func(i int, r ItemResult) { got[i] = r }))
	if res[0].Outcome != LeaseLost || !errors.Is(res[0].Err, ErrLeaseLost) {
		t.Errorf("the item whose lease was taken: %v, %v; want LeaseLost", res[0].Outcome, res[0].Err)
	}
	if res[1].Outcome != Processed || res[1].Err != nil {
		t.Errorf("the other item: %v, %v; want Processed", res[1].Outcome, res[1].Err)
	}
	if got != [2]ItemResult(res) {
		t.Errorf("done reported %+v, the call returned %+v", got, res)
	}
	if a, _ := claim1(context.Background(), mem, h.RecordKey("kept"), "x", "", time.Minute); a.Status != driver.StatusDuplicate {
		t.Errorf("kept item's record: %+v; want DONE", a)
	}
}

// In a filter batch run one item at a time (HandleBatch, parallel 1), an fn that ends
// the caller's goroutine does not leave the items after it unrun: they are marked
// DONE already, so unrun they would be lost (their redeliveries are duplicates).
func TestFilterBatchGoexitStillRunsTheMarkedItems(t *testing.T) {
	mem, _ := memstore.New()
	h := newDeduperOver(t, mem).mustRegister(t, "serial-goexit", WithMode(ModeFilter))
	var mu sync.Mutex
	ran := map[int]bool{}
	got, _ := batchOnItsOwn(h, []Item{{Key: "a"}, {Key: "b"}, {Key: "c"}}, 1, func(ctx context.Context, i int) error {
		if i == 0 {
			runtime.Goexit()
		}
		mu.Lock()
		ran[i] = true
		mu.Unlock()
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if got[0].Outcome != Panicked || !errors.Is(got[0].Err, ErrPanic) {
		t.Errorf("item a: %+v, want Panicked", got[0])
	}
	for i := 1; i < 3; i++ {
		if !ran[i] || got[i].Outcome != Processed {
			t.Errorf("item %d: ran %v, %+v; want run and Processed", i, ran[i], got[i])
		}
	}
}

// batchOnItsOwn runs HandleBatchParallel on a goroutine of its own, which an fn may end
// (runtime.Goexit), and returns the results done reported, and whether the call
// returned.
func batchOnItsOwn(h *Handler, items []Item, parallel int, fn func(ctx context.Context, i int) error) (map[int]ItemResult, bool) {
	var mu sync.Mutex
	got := map[int]ItemResult{}
	returned := false
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		h.Run(context.Background(), items, fn, Parallel(parallel), OnResult(func(i int, r ItemResult) {
			mu.Lock()
			got[i] = r
			mu.Unlock()
		}))
		returned = true
	}()
	<-finished
	mu.Lock()
	defer mu.Unlock()
	return got, returned
}

// goid returns the current goroutine's id, read from its stack header.
func goid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	id, _ := strconv.ParseUint(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return id
}
