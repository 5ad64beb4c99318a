package dedup

import (
	"context"
	"errors"
	"fmt"
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
