package dedup

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/internal/batcher"
	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// gateStore holds every Claim until open is closed, and records each Claim's keys.
type gateStore struct {
	driver.Store
	open chan struct{}

	mu      sync.Mutex
	waiting int        // claims held at the gate
	calls   [][]string // each Claim's keys, in arrival order
}

func (s *gateStore) Claim(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	keys := make([]string, len(entries))
	for i, e := range entries {
		keys[i] = e.Key
	}
	s.mu.Lock()
	s.calls = append(s.calls, keys)
	s.waiting++
	s.mu.Unlock()
	<-s.open
	return s.Store.Claim(ctx, entries)
}

func (s *gateStore) held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiting
}

func (s *gateStore) claimCalls() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]string(nil), s.calls...)
}

func newGated(t *testing.T) (*Deduper, *gateStore) {
	t.Helper()
	mem, _ := memstore.New()
	gs := &gateStore{Store: mem, open: make(chan struct{})}
	d, err := New(gs, WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, gs
}

// While batcher.InFlight claims are out, the claims of every other caller, whatever their
// handler, queue and then go to the store as one call.
func TestBatcherMergesTheClaimsOfEveryCaller(t *testing.T) {
	d, gs := newGated(t)
	a, _ := d.Register("a")
	b, _ := d.Register("b")
	ctx := context.Background()
	var wg sync.WaitGroup
	do := func(h *Handler, key string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if res, err := h.Do(ctx, key, func(context.Context) error { return nil }); res.Outcome != Processed {
				t.Errorf("%s %s: %v %v", h.Name(), key, res.Outcome, err)
			}
		}()
	}
	for i := range batcher.InFlight { // one at a time: each its own call
		do(a, fmt.Sprint("first-", i))
		testenv.Eventually(t, 5*time.Second, "the claim at the gate", func() bool { return gs.held() == i+1 })
	}
	const later = 10
	for i := range later {
		do([]*Handler{a, b}[i%2], fmt.Sprint("later-", i))
	}
	testenv.Eventually(t, 5*time.Second, "the later claims queued", func() bool { return d.g.Queued("claim") == later })
	close(gs.open)
	wg.Wait()
	calls := gs.claimCalls()
	if len(calls) != batcher.InFlight+1 {
		t.Fatalf("%d Claim calls, want %d: %q", len(calls), batcher.InFlight+1, calls)
	}
	last := calls[batcher.InFlight]
	heads := map[string]int{}
	for _, k := range last {
		heads[k[:strings.LastIndexByte(k, ':')]]++
	}
	if len(last) != later || heads["dedup:a"] != later/2 || heads["dedup:b"] != later/2 {
		t.Errorf("the queued claims went as %q, want one call of %d entries, half of each handler", last, later)
	}
}

// A caller whose deadline passes while its claim is still queued returns by it, and
// its claim never reaches the store.
func TestBatcherDropsAClaimGivenUpBeforeItWasSent(t *testing.T) {
	d, gs := newGated(t)
	h, _ := d.Register("a")
	var wg sync.WaitGroup
	for i := range batcher.InFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.Do(context.Background(), fmt.Sprint("first-", i), func(context.Context) error { return nil })
		}()
		testenv.Eventually(t, 5*time.Second, "the claim at the gate", func() bool { return gs.held() == i+1 })
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	res, err := h.Do(ctx, "late", func(context.Context) error { t.Error("fn ran"); return nil })
	if took := time.Since(start); took > time.Second {
		t.Errorf("Do returned after %v, its deadline was 50ms", took)
	}
	if res.Outcome != Cancelled && res.Outcome != StoreUnavailable || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Do = %v, %v; want it given up at its deadline", res.Outcome, err)
	}
	close(gs.open)
	wg.Wait()
	d.Close()
	for _, call := range gs.claimCalls() {
		for _, k := range call {
			if strings.HasSuffix(k, ":late") {
				t.Errorf("the given-up claim reached the store: %q", call)
			}
		}
	}
}

// honouringStore answers from memory and reports whether it honours deadlines. Each
// Mark and Claim sends the goroutine it runs on; with hang, a Claim waits for its
// context to end. It records the keys it was asked to release.
type honouringStore struct {
	driver.Store
	honours bool
	hang    bool
	on      chan uint64

	mu       sync.Mutex
	released []string
}

func (s *honouringStore) HonoursDeadlines() bool { return s.honours }

func (s *honouringStore) Mark(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	s.on <- goroutineID()
	return s.Store.Mark(ctx, entries)
}

func (s *honouringStore) Claim(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	s.on <- goroutineID()
	if s.hang {
		<-ctx.Done()
		return nil, fmt.Errorf("%w: %w", ErrStoreUnavailable, ctx.Err())
	}
	return s.Store.Claim(ctx, entries)
}

func (s *honouringStore) Release(ctx context.Context, entries []driver.Entry) ([]error, error) {
	s.mu.Lock()
	for _, e := range entries {
		s.released = append(s.released, e.Key)
	}
	s.mu.Unlock()
	return s.Store.Release(ctx, entries)
}

func (s *honouringStore) releasedKeys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.released...)
}

// goroutineID is the number of the calling goroutine, from its stack's first line.
func goroutineID() uint64 {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	var id uint64
	fmt.Sscanf(string(buf), "goroutine %d ", &id)
	return id
}

// A store that honours deadlines gets a lone claim or mark from its caller's
// goroutine, which saves the batcher's hand-off each way; one that does not, from a
// goroutine of the batcher's, so that the caller returns by its deadline whatever the
// store does. Sent alone, a call with no deadline is cut at batcher.CloseWait, so
// that Close's bound holds, and the claim cut short is given back once.
func TestALoneCallGoesFromItsCallerWhenTheStoreHonoursDeadlines(t *testing.T) {
	for _, honours := range []bool{true, false} {
		t.Run(fmt.Sprintf("honours=%v", honours), func(t *testing.T) {
			mem, _ := memstore.New()
			s := &honouringStore{Store: mem, honours: honours, on: make(chan uint64, 4)}
			d, err := New(s, WithLogger(quiet))
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			filter, _ := d.Register("filter", WithMode(ModeFilter))
			h, _ := d.Register("orders")
			ctx := context.Background()
			me := goroutineID()
			if res, err := filter.Mark(ctx, "m"); err != nil || res.Outcome != First {
				t.Fatalf("Mark: %v %v", res.Outcome, err)
			}
			if on := <-s.on; (on == me) != honours {
				t.Errorf("the Mark ran on goroutine %d, its caller is %d", on, me)
			}
			if res, err := h.Do(ctx, "d", func(context.Context) error { return nil }); err != nil || res.Outcome != Processed {
				t.Fatalf("Do: %v %v", res.Outcome, err)
			}
			if on := <-s.on; (on == me) != honours {
				t.Errorf("the Claim ran on goroutine %d, its caller is %d", on, me)
			}
		})
	}
	t.Run("cut at CloseWait", func(t *testing.T) {
		mem, _ := memstore.New()
		s := &honouringStore{Store: mem, honours: true, hang: true, on: make(chan uint64, 4)}
		d, err := New(s, WithLogger(quiet))
		if err != nil {
			t.Fatal(err)
		}
		h, _ := d.Register("orders")
		start := time.Now()
		res, err := h.Do(context.Background(), "hung", func(context.Context) error { return nil })
		took := time.Since(start)
		if res.Outcome != StoreUnavailable || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("a claim the store does not answer: %v %v", res.Outcome, err)
		}
		if took < batcher.CloseWait-50*time.Millisecond || took > batcher.CloseWait+time.Second {
			t.Errorf("it returned after %v, want about %v", took, batcher.CloseWait)
		}
		if err := d.Close(); err != nil { // Close waits for the give-back
			t.Fatal(err)
		}
		if got := s.releasedKeys(); len(got) != 1 || !strings.HasSuffix(got[0], ":hung") {
			t.Errorf("released %q, want the claim cut short", got)
		}
	})
}
