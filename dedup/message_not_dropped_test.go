package dedup

// A message is never dropped for a duplicate it is not: closes, lost replies and
// expiries between the steps of a run.

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/dedup/storetest"
)

// Tenants on one store cannot share a record: a prefix may not hold ':', which could
// reproduce another tenant's keys ("acme"+"eu"+"orders:123" against "acme:eu"+"orders"+"123").
func TestPrefixWithSeparatorRejected(t *testing.T) {
	mem, _ := memstore.New()
	if _, err := New(mem, WithPrefix("acme:eu")); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("prefix with ':' accepted: %v", err)
	}
}

func TestMarkDoesNotCacheInProgress(t *testing.T) {
	mem, _ := memstore.New()
	p1, _ := New(mem, WithLogger(quiet))
	p2, _ := New(mem, WithLogger(quiet))
	defer p1.Close()
	defer p2.Close()
	h1, _ := p1.Register("h")
	h2, _ := p2.Register("h")
	ctx := context.Background()
	started, fail, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		h1.Do(ctx, "k", func(context.Context) error { close(started); <-fail; return errors.New("boom") })
	}()
	<-started
	h2.Mark(ctx, "k") // Duplicate: record is IN PROGRESS
	close(fail)
	<-done // p1 failed and released
	ran := false
	r, _ := h2.Do(ctx, "k", func(context.Context) error { ran = true; return nil })
	if !ran {
		t.Errorf("p2 Do: %v tier %v, message never processed", r.Outcome, r.Tier)
	}
}

func TestGoexitStopsHeartbeatAndReleases(t *testing.T) {
	f := newFixture(t, true)
	lease := 60 * time.Millisecond
	h := f.handler("g", WithLease(lease))
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		h.Do(context.Background(), "k", func(context.Context) error { runtime.Goexit(); return nil })
	}()
	<-exited
	f.d.Close()
	e0 := f.store.extends.Load()
	time.Sleep(5 * lease)
	a, _ := claim1(context.Background(), f.mem, h.RecordKey("k"), "rival", "", lease)
	if f.store.extends.Load() > e0 || a.Status != driver.StatusAcquired {
		t.Errorf("after Close: extends %d -> %d, rival claim %v", e0, f.store.extends.Load(), a.Status)
	}
}

func TestMemoryStoreSweepsEarlierExpiry(t *testing.T) {
	clk := storetest.NewClock()
	s, _ := memstore.New(memstore.WithLimit(2), memstore.WithClock(clk.Now))
	ctx := context.Background()
	claim1(ctx, s, "x", "x", "", time.Hour)
	mark1(ctx, s, "y", "y", "", time.Hour)
	mark1(ctx, s, "z", "z", "", time.Hour) // full: sweep sets nextExp = now+1h
	release1(ctx, s, "x", "x")
	claim1(ctx, s, "w", "w", "", time.Second)
	clk.Add(2 * time.Second)
	if _, err := mark1(ctx, s, "z", "z", "", time.Hour); err != nil {
		t.Errorf("mark z: %v (w is expired)", err)
	}
}

type rawMsgT struct{ id string }

func (m rawMsgT) Header(n string) string {
	if n == "Nats-Msg-Id" {
		return m.id
	}
	return ""
}
func (m rawMsgT) Data() []byte { return nil }

func TestFilterCloseBetweenMarkAndRunNeverDropsTheMessage(t *testing.T) {
	f := newFixture(t, false)
	h := f.handler("m", WithMode(ModeFilter))
	f.store.onFail(func(op string) error {
		if op == "mark" {
			go f.d.Close()
			for {
				f.d.mu.RLock()
				c := f.d.closed
				f.d.mu.RUnlock()
				if c {
					return nil
				}
				time.Sleep(time.Millisecond)
			}
		}
		return nil
	})
	ran := false
	res, err := h.Handle(context.Background(), rawMsgT{"m1"}, func(context.Context) error { ran = true; return nil })
	a, _ := claim1(context.Background(), f.mem, h.RecordKey("m1"), "redelivery", "", time.Minute)
	if !ran && a.Status == driver.StatusDuplicate {
		t.Errorf("Handle %v (%v), fn not run, redelivery sees %v", res.Outcome, err, a.Status)
	}
}

type slowExtend struct {
	driver.Store
	n atomic.Int64
}

func (s *slowExtend) Extend(ctx context.Context, entries []driver.Entry) ([]error, error) {
	if s.n.Add(1) == 1 {
		errs, err := s.Store.Extend(ctx, entries) // lands now
		time.Sleep(50 * time.Millisecond)         // slow reply
		return errs, err
	}
	return nil, fmt.Errorf("%w: i/o timeout", ErrStoreUnavailable)
}

func TestHeartbeatStopsFnBeforeLeaseEnds(t *testing.T) {
	mem, _ := memstore.New()
	d, _ := New(&slowExtend{Store: mem}, WithLogger(quiet))
	defer d.Close()
	lease := 300 * time.Millisecond
	h, _ := d.Register("slow", WithLease(lease))
	rd, _ := New(mem, WithLogger(quiet))
	defer rd.Close()
	rival, _ := rd.Register("slow", WithLease(lease))
	start := time.Now()
	var cancelledAt, rivalRanAt atomic.Int64
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			rival.Do(context.Background(), "k", func(context.Context) error {
				rivalRanAt.CompareAndSwap(0, int64(time.Since(start)))
				return nil
			})
			time.Sleep(2 * time.Millisecond)
		}
	}()
	h.Do(context.Background(), "k", func(ctx context.Context) error {
		<-ctx.Done()
		cancelledAt.Store(int64(time.Since(start)))
		return ctx.Err()
	})
	close(stop)
	if r := rivalRanAt.Load(); r != 0 && r < cancelledAt.Load() {
		t.Errorf("rival ran at %v, first fn cancelled at %v: overlap %v", time.Duration(r),
			time.Duration(cancelledAt.Load()), time.Duration(cancelledAt.Load()-r))
	}
}

// A Duplicate answered by the store is cached locally for no longer than the record
// has left there.
func TestLocalTierNeverOutlivesStoreRecord(t *testing.T) {
	f := newFixture(t, false)
	h := f.handler("orders", WithRetention(time.Hour))
	other := newDeduperOver(t, f.store).mustRegister(t, "orders", WithRetention(time.Hour))
	ctx := context.Background()
	if res, _ := other.Do(ctx, "k", ok); res.Outcome != Processed {
		t.Fatal(res)
	}
	f.clk.Add(time.Hour - 50*time.Millisecond) // the record has 50ms left
	if res, _ := h.Do(ctx, "k", ok); res.Outcome != Duplicate || res.Tier != TierStore {
		t.Fatal(res)
	}
	time.Sleep(60 * time.Millisecond) // the local tier runs on the real clock
	f.clk.Add(60 * time.Millisecond)
	ran := false
	if res, _ := h.Do(ctx, "k", func(context.Context) error { ran = true; return nil }); !ran {
		t.Fatalf("answered %v/%v from a local entry that outlived the store's record", res.Outcome, res.Tier)
	}
}

// A waiter whose leader was cancelled by the leader's own context asks the store
// itself instead of taking the leader's Cancelled.
func TestWaiterRetriesAfterLeaderCancelled(t *testing.T) {
	f := newFixture(t, false)
	entered := make(chan struct{})
	release := make(chan struct{})
	f.store.onFail(func(op string) error {
		if op == "claim" && f.store.claims.Load() == 1 {
			close(entered)
			<-release // hold the leader inside its claim
			return context.Canceled
		}
		return nil
	})
	h := f.handler("orders")
	leaderCtx, cancelLeader := context.WithCancel(context.Background())
	done := make(chan Result)
	go func() {
		res, _ := h.Do(leaderCtx, "k", ok)
		done <- res
	}()
	<-entered
	waiter := make(chan Result)
	go func() {
		res, _ := h.Do(context.Background(), "k", ok)
		waiter <- res
	}()
	time.Sleep(20 * time.Millisecond) // let the waiter join the leader's flight
	cancelLeader()
	close(release)
	if res := <-done; res.Outcome != Cancelled {
		t.Fatalf("leader: %v", res.Outcome)
	}
	if res := <-waiter; res.Outcome != Processed {
		t.Fatalf("waiter took the leader's answer: %v", res.Outcome)
	}
}
