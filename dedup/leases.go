package dedup

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/internal/meter"
	"github.com/dedupkit/dedupkit/internal/storekit"
)

// leases is a handler's lease table: the claims its runs hold. One goroutine, running
// while the table is not empty, extends the due claims in one call per tick
// (docs/design.md §5); a claim whose lease is lost, or may be, cancels its fn.
type leases struct {
	h       *Handler
	mu      sync.Mutex
	live    map[*batchItem]struct{}                // claims to extend
	running map[*batchItem]context.CancelCauseFunc // the claims whose fn runs now
	ticking bool                                   // the goroutine runs
	stopped chan struct{}                          // closed when the goroutine ends; nil before it starts
}

// add puts b's claim, just acquired, in the table, and starts the goroutine if none
// runs. b.f.leaseEnd must hold the lease's end.
func (l *leases) add(b *batchItem) {
	l.mu.Lock()
	if l.live == nil {
		l.live = make(map[*batchItem]struct{})
		l.running = make(map[*batchItem]context.CancelCauseFunc)
	}
	l.live[b] = struct{}{}
	if !l.ticking {
		l.ticking = true
		prev, stopped := l.stopped, make(chan struct{})
		l.stopped = stopped
		go l.run(prev, stopped)
	}
	l.mu.Unlock()
}

// forget takes b out of the table: its claim is settled or being completed.
func (l *leases) forget(b *batchItem) {
	l.mu.Lock()
	delete(l.live, b)
	delete(l.running, b)
	l.mu.Unlock()
}

// setRunning records that b's fn runs now, so that losing its lease cancels it. It
// reports false, and records nothing, if b's lease is lost or has run out.
func (l *leases) setRunning(b *batchItem, cancel context.CancelCauseFunc) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	// lost, or past its end as this process knows it: another owner may hold the key
	if _, live := l.live[b]; !live || b.lost.Load() || time.Now().UnixNano() >= b.f.leaseEnd.Load() {
		return false
	}
	l.running[b] = cancel
	return true
}

// stopRunning records that b's fn has returned.
func (l *leases) stopRunning(b *batchItem) {
	l.mu.Lock()
	delete(l.running, b)
	l.mu.Unlock()
}

// renew extends the claim of an item not yet run whose lease ran out as far as this
// process knows. Extend succeeds only while the record holds b's token, so b may then
// run under a fresh lease. A failure for want of the store sets noRenew: the batch
// tries no more, since each would wait as long.
func (l *leases) renew(ctx context.Context, b *batchItem, noRenew *atomic.Bool) bool {
	h := l.h
	if noRenew.Load() || ctx.Err() != nil || h.d.ctx.Err() != nil {
		return false
	}
	ectx, done := context.WithTimeout(ctx, h.cfg.lease/3)
	defer done()
	sent := time.Now()
	if err := storekit.OnlyErr(h.store.Extend(ectx, []driver.Entry{{Key: b.rk, Token: b.token, TTL: h.cfg.lease}})); err != nil {
		if !errors.Is(err, ErrLeaseLost) {
			noRenew.Store(true)
		}
		return false
	}
	l.mu.Lock()
	b.f.leaseEnd.Store(sent.Add(h.cfg.lease).UnixNano())
	b.lost.Store(false)
	l.live[b] = struct{}{}
	l.mu.Unlock()
	return true
}

// tickEvery is how often the table's goroutine looks for claims to extend; a claim
// is extended once a third of its lease has passed, so every lease/3 to lease/2.
func (l *leases) tickEvery() time.Duration { return l.h.cfg.lease / 6 }

// run ticks until a tick finds the table empty, or the Deduper's calls have all
// ended (Close). It waits for the goroutine before it (prev) to end first.
func (l *leases) run(prev, stopped chan struct{}) {
	defer close(stopped)
	if prev != nil {
		<-prev
	}
	t := time.NewTicker(l.tickEvery())
	defer t.Stop()
	var due []*batchItem
	for {
		select {
		case <-l.h.d.quiet:
			l.mu.Lock()
			l.ticking = false
			l.mu.Unlock()
			return
		case <-t.C:
		}
		now := time.Now().UnixNano()
		l.mu.Lock()
		if len(l.live) == 0 {
			l.ticking = false
			l.mu.Unlock()
			return
		}
		due = due[:0]
		for b := range l.live {
			if time.Duration(b.f.leaseEnd.Load()-now) <= l.h.cfg.lease*2/3 {
				due = append(due, b)
			}
		}
		l.mu.Unlock()
		l.extendAll(due)
		clear(due)
	}
}

// extendAll extends the claims in due in one call. A claim is lost when the store
// says so, or when a failed extension leaves its lease (as last known, less a margin
// of lease/6) to end before the next tick: fn must stop before another owner can take
// the key, not after.
func (l *leases) extendAll(due []*batchItem) {
	if len(due) == 0 {
		return
	}
	h := l.h
	margin := h.cfg.lease / 6
	sent := time.Now()
	ends := make([]int64, len(due))
	entries := make([]driver.Entry, 0, len(due))
	asked := make([]int, 0, len(due))
	timeout := h.cfg.lease / 3
	for i, b := range due {
		ends[i] = b.f.leaseEnd.Load()
		left := time.Unix(0, ends[i]).Sub(sent) - margin
		if left <= 0 {
			l.lost(b, ends[i])
			continue
		}
		timeout = min(timeout, left)
		entries = append(entries, driver.Entry{Key: b.rk, Token: b.token, TTL: h.cfg.lease})
		asked = append(asked, i)
	}
	if len(entries) == 0 {
		return
	}
	ctx, done := context.WithTimeout(context.Background(), timeout)
	errs, err := h.store.Extend(ctx, entries)
	done()
	for j, i := range asked {
		b, end := due[i], ends[i]
		e := err
		if e == nil && j < len(errs) {
			e = errs[j]
		} else if e == nil {
			e = fmt.Errorf("%w: %d answers to %d extensions", ErrStoreUnavailable, len(errs), len(entries))
		}
		switch {
		case e == nil:
			b.f.leaseEnd.CompareAndSwap(end, sent.Add(h.cfg.lease).UnixNano()) // unless renewed since
		case errors.Is(e, ErrLeaseLost):
			l.lost(b, end)
		default:
			h.log.Debug("dedup: lease extension failed", "err", e)
			if !time.Now().Add(l.tickEvery() + margin).Before(time.Unix(0, end)) {
				l.lost(b, end)
			}
		}
	}
}

// lost records that b's lease, last known to end at end, is lost, and cancels its
// fn; unless b was settled, or renewed while the verdict was out.
func (l *leases) lost(b *batchItem, end int64) {
	h := l.h
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, live := l.live[b]; !live || b.f.leaseEnd.Load() != end {
		return
	}
	h.stats.leaseLost.Add(1)
	h.met.LeaseLost(meter.OpExtend)
	b.lost.Store(true)
	delete(l.live, b)
	if cancel, ok := l.running[b]; ok {
		cancel(ErrLeaseLost)
	}
}

// wait waits for the table's goroutine to end (Close, once the calls have ended).
func (l *leases) wait() {
	l.mu.Lock()
	stopped := l.stopped
	l.mu.Unlock()
	if stopped != nil {
		<-stopped
	}
}
