package dedup

// A key never runs under two owners: a Goexit, a per-item claim error under FailOpen
// and a stalling extension each leave it with one owner.

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/memstore"
)

// Goexit in a later batch item leaves earlier successful items claimed, not DONE:
// after the lease, a redelivery runs them again.
func TestBatchGoexitCompletesFinishedItems(t *testing.T) {
	mem, _ := memstore.New()
	d, _ := New(mem, WithLogger(quiet))
	defer d.Close()
	lease := 100 * time.Millisecond
	h, _ := d.Register("gx", WithLease(lease), WithLocalCache(0, 0))
	var runs [2]atomic.Int32
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		h.Run(context.Background(), []Item{{Key: "a"}, {Key: "b"}}, func(ctx context.Context, i int) error {
			runs[i].Add(1)
			if i == 1 {
				runtime.Goexit()
			}
			return nil
		})
	}()
	<-ch
	time.Sleep(2 * lease)
	res, _ := h.Do(context.Background(), "a", func(context.Context) error { runs[0].Add(1); return nil })
	t.Logf("redelivery of a: %v; a ran %d times", res.Outcome, runs[0].Load())
	if runs[0].Load() != 1 {
		t.Errorf("item a returned nil once but ran %d times", runs[0].Load())
	}
}

// A per-item claim error under FailOpen runs that item inline before the heartbeat
// starts; the next item's claim expires meanwhile and it runs under another owner's lease.
type itemErrStore struct {
	driver.Store
	badKey string
}

func (s itemErrStore) Claim(ctx context.Context, es []driver.Entry) ([]driver.Answer, error) {
	out, err := s.Store.Claim(ctx, es)
	for i, e := range es {
		if e.Key == s.badKey {
			out[i] = driver.Answer{Err: errors.New("CLUSTERDOWN slot not served")}
		}
	}
	return out, err
}

func TestBatchFailOpenItemRunsAfterClaimedOnes(t *testing.T) {
	mem, _ := memstore.New()
	lease := 90 * time.Millisecond
	d0, _ := New(mem, WithLogger(quiet))
	h0, _ := d0.Register("fo", WithLease(lease))
	d, _ := New(itemErrStore{mem, h0.RecordKey("a")}, WithLogger(quiet))
	defer d.Close()
	defer d0.Close()
	h, _ := d.Register("fo", WithLease(lease), WithStoreFailure(FailOpen))
	var concurrent, bRuns atomic.Int32
	var otherRes Result
	res := h.Run(context.Background(), []Item{{Key: "a"}, {Key: "b"}}, func(ctx context.Context, i int) error {
		if i == 0 {
			time.Sleep(2 * lease) // were b's claim not heartbeated now, it would expire
			otherRes, _ = h0.Do(context.Background(), "b", func(context.Context) error {
				concurrent.Add(1)
				time.Sleep(lease)
				concurrent.Add(-1)
				return nil
			})
			return nil
		}
		bRuns.Add(1)
		if concurrent.Load() > 0 {
			t.Errorf("batch runs b while another owner runs it (ctx err %v)", ctx.Err())
		}
		return nil
	})
	if res[0].Outcome != Processed || !res[0].Unguarded || res[1].Outcome != Processed || bRuns.Load() != 1 {
		t.Fatalf("batch: a=%v (unguarded %v) b=%v/%v, b ran %d times", res[0].Outcome, res[0].Unguarded, res[1].Outcome, res[1].Err, bRuns.Load())
	}
	if otherRes.Outcome != Duplicate {
		t.Fatalf("another owner got %v for b, which the batch had processed", otherRes.Outcome)
	}
}

// An extension fails fast once, then the store stalls: fn is cancelled only at the lease end.
type fastThenStall struct {
	driver.Store
	n atomic.Int32
}

func (s *fastThenStall) Extend(ctx context.Context, _ []driver.Entry) ([]error, error) {
	if s.n.Add(1) == 1 {
		return nil, ErrStoreUnavailable
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

func TestHeartbeatCancelsBeforeLeaseEndAfterStall(t *testing.T) {
	mem, _ := memstore.New()
	lease := 300 * time.Millisecond
	d, _ := New(&fastThenStall{Store: mem}, WithLogger(quiet))
	defer d.Close()
	h, _ := d.Register("hb3", WithLease(lease))
	d2, _ := New(mem, WithLogger(quiet))
	defer d2.Close()
	h2, _ := d2.Register("hb3", WithLease(lease))
	start := time.Now()
	var other atomic.Int64
	go func() {
		for time.Since(start) < 2*lease {
			if r, _ := h2.Do(context.Background(), "k", func(context.Context) error { return nil }); r.Outcome == Processed {
				other.Store(int64(time.Since(start)))
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	var cancelledAt time.Duration
	h.Do(context.Background(), "k", func(ctx context.Context) error {
		<-ctx.Done()
		cancelledAt = time.Since(start)
		return ctx.Err()
	})
	time.Sleep(lease) // let the other owner try until after the lease
	if got := time.Duration(other.Load()); got != 0 && got <= cancelledAt {
		t.Fatalf("another owner processed the key at %v, before fn was cancelled at %v", got, cancelledAt)
	}
	if cancelledAt >= lease {
		t.Fatalf("fn cancelled at %v, not before its %v lease ended", cancelledAt, lease)
	}
}
