package dedup

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// stallComplete holds every Complete until open is closed.
type stallComplete struct {
	driver.Store
	open chan struct{}
}

func (s *stallComplete) Complete(ctx context.Context, entries []driver.Entry) ([]error, error) {
	<-s.open
	return s.Store.Complete(ctx, entries)
}

// A batch returns by its caller's deadline (plus batcher.SettleGrace) although the store
// does not answer its completions: the items whose completion is still out are
// NotRecorded, each reported once, as a single call's would be; the completions land
// later, and nothing is lost.
func TestBatchReturnsByItsDeadlineWhileCompletionsAreOut(t *testing.T) {
	mem, _ := memstore.New()
	st := &stallComplete{Store: mem, open: make(chan struct{})}
	d, err := New(st, WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var opened sync.Once
	defer opened.Do(func() { close(st.open) }) // before Close, which would wait for the calls out
	// a Run that waits for its completions returns once this opens: late, not never
	time.AfterFunc(3*time.Second, func() { opened.Do(func() { close(st.open) }) })
	h, _ := d.Register("orders")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	var mu sync.Mutex
	reported := map[int]int{}
	start := time.Now()
	res := h.Run(ctx, []Item{{Key: "a"}, {Key: "b"}}, func(context.Context, int) error { return nil },
		OnResult(func(i int, _ ItemResult) {
			mu.Lock()
			reported[i]++
			mu.Unlock()
		}))
	if took := time.Since(start); took > time.Second {
		t.Errorf("Run returned after %v; its deadline was 200ms", took)
	}
	for i, r := range res {
		if r.Outcome != NotRecorded || !errors.Is(r.Err, ErrNotRecorded) {
			t.Errorf("item %d: %v, %v; want NotRecorded", i, r.Outcome, r.Err)
		}
	}
	opened.Do(func() { close(st.open) })
	for _, k := range []string{"a", "b"} {
		testenv.Eventually(t, 5*time.Second, "DONE written late", func() bool {
			a, _ := claim1(context.Background(), mem, h.RecordKey(k), "probe", "", time.Minute)
			return a.Status == driver.StatusDuplicate
		})
	}
	d.Close()
	mu.Lock()
	defer mu.Unlock()
	if reported[0] != 1 || reported[1] != 1 {
		t.Errorf("OnResult calls per item: %v, want one each", reported)
	}
}
