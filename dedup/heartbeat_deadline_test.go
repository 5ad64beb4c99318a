package dedup

// Batches end and give their claims back: a Goexit, a silent store, a heartbeat
// that cannot reach the store.

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/memstore"
)

// runtime.Goexit in a batch fn: running.Done never called -> Close hangs; claims not released.
func TestBatchGoexitReleasesAndCloses(t *testing.T) {
	mem, _ := memstore.New()
	d, _ := New(mem, WithLogger(quiet))
	h, _ := d.Register("b1", WithLease(time.Minute))
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.Run(context.Background(), []Item{{Key: "a"}, {Key: "b"}}, func(ctx context.Context, i int) error {
			runtime.Goexit()
			return nil
		})
	}()
	<-done
	// are the claims still held?
	a, _ := claim1(context.Background(), mem, h.RecordKey("b"), "other", "", time.Minute)
	if a.Status != driver.StatusAcquired {
		t.Errorf("claim of b by another owner after the Goexit: %v (ttl %v), want it released", a.Status, a.TTL)
	}
	closed := make(chan struct{})
	go func() { d.Close(); close(closed) }()
	select {
	case <-closed:
		t.Log("Close returned")
	case <-time.After(2 * time.Second):
		t.Fatal("Close still blocked 2s after the batch goroutine exited")
	}
}

// A batch runs its keyed items in order, then the keyless ones.
func TestBatchRunsItemsInOrder(t *testing.T) {
	f := newFixture(t, true)
	h := f.handler("ord", WithMissingKey(ProcessMissingKey))
	var order []int
	h.Run(context.Background(), []Item{{Key: "a"}, {Key: "b"}, {Key: ""}}, func(ctx context.Context, i int) error {
		order = append(order, i)
		return nil
	})
	if order[0] != 0 {
		t.Fatalf("run order %v, doc says items run in order", order)
	}
}

// blackholed Extend: waits for its context (a partitioned Redis).
type blackholeExtend struct{ driver.Store }

func (s blackholeExtend) Extend(ctx context.Context, _ []driver.Entry) ([]error, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// With a store that times out, extensions sent one after another would cancel the
// running item only at or after its lease end, so that another owner ran it while fn
// still ran with a live context: the lease table sends them side by side, and the
// running item is cancelled before its lease can end.
func TestBatchHeartbeatCancelsRunningItemInTime(t *testing.T) {
	mem, _ := memstore.New()
	d, _ := New(blackholeExtend{mem}, WithLogger(quiet))
	defer d.Close()
	lease := 300 * time.Millisecond
	h, _ := d.Register("hb", WithLease(lease))
	d2, _ := New(mem, WithLogger(quiet))
	defer d2.Close()
	h2, _ := d2.Register("hb", WithLease(lease))

	items := make([]Item, 10)
	for i := range items {
		items[i] = Item{Key: "k" + string(rune('a'+i))}
	}
	var overlap atomic.Int32
	var cancelAt time.Duration
	start := time.Now()
	var wg sync.WaitGroup
	h.Run(context.Background(), items, func(ctx context.Context, i int) error {
		if i != 0 {
			return nil
		}
		// while item 0 runs, another instance tries the same key every 10ms
		stop := make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				res, _ := h2.Do(context.Background(), "ka", func(context.Context) error {
					if ctx.Err() == nil {
						overlap.Add(1)
					}
					return nil
				})
				if res.Outcome == Processed {
					return
				}
			}
		}()
		<-ctx.Done()
		cancelAt = time.Since(start)
		close(stop)
		return ctx.Err()
	})
	wg.Wait()
	t.Logf("item 0 cancelled after %v (lease %v); other owner ran it while item 0's ctx was live: %d", cancelAt, lease, overlap.Load())
	if overlap.Load() > 0 || cancelAt >= lease {
		t.Fatal("batch heartbeat let the lease run out before cancelling fn")
	}
}

// deafExtend ignores its context, as go-redis does without ContextTimeoutEnabled: a
// stalled connection holds the call for its own ReadTimeout and retries.
type deafExtend struct {
	driver.Store
	stall time.Duration
}

func (s deafExtend) Extend(context.Context, []driver.Entry) ([]error, error) {
	time.Sleep(s.stall)
	return nil, fmt.Errorf("%w: i/o timeout", ErrStoreUnavailable)
}

// The heartbeat stops waiting at its own deadline, so fn is cancelled while the lease
// is still ours even when the store ignores deadlines.
func TestHeartbeatDoesNotWaitForADeafStore(t *testing.T) {
	mem, _ := memstore.New()
	d, _ := New(deafExtend{mem, 2 * time.Second}, WithLogger(quiet))
	lease := 300 * time.Millisecond
	h, _ := d.Register("deaf", WithLease(lease))
	start := time.Now()
	var cancelledAt time.Duration
	h.Do(context.Background(), "k", func(ctx context.Context) error {
		<-ctx.Done()
		cancelledAt = time.Since(start)
		return ctx.Err()
	})
	d.Close() // waits for the stalled extension goroutines
	if cancelledAt >= lease {
		t.Fatalf("fn cancelled %v after the claim, past its %v lease", cancelledAt, lease)
	}
}
