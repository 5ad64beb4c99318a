package dedup

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// leases is a handler's lease table: the claims its runs hold, single calls' and
// batch items' alike. One goroutine, running while the table is not empty, ticks
// every lease/6 and extends the claims that have run a third of their lease since
// they were taken or last extended, all at once (docs/design.md §5). A claim whose
// lease is lost, or may be, cancels its fn with ErrLeaseLost.
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
	// lost, or past the end of the lease as this process knows it (the goroutine may
	// not have had its say yet): another owner may hold the key
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

// renew extends the claim of an item that has not run yet, after the table lost
// track of it (its lease ran out as far as this process knows). The store's Extend
// succeeds only while the record still holds b's token: then no other owner has
// claimed or completed the key, and b may run under a fresh lease. It reports
// whether it did. Once a renewal fails for want of the store, noRenew is set, and a
// batch tries no more: each would wait as long, one after the other.
func (l *leases) renew(ctx context.Context, b *batchItem, noRenew *atomic.Bool) bool {
	h := l.h
	if noRenew.Load() || ctx.Err() != nil || h.d.ctx.Err() != nil {
		return false
	}
	ectx, done := context.WithTimeout(ctx, h.cfg.lease/3)
	defer done()
	sent := time.Now()
	if err := h.store.Extend(ectx, b.rk, b.token, h.cfg.lease); err != nil {
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

// extendAll extends the claims in due side by side: one slow extension must not
// hold back the others.
func (l *leases) extendAll(due []*batchItem) {
	h := l.h
	var wg sync.WaitGroup
	for _, b := range due {
		wg.Add(1)
		go func() {
			defer wg.Done()
			end := b.f.leaseEnd.Load()
			until, lost := h.extend(b.rk, b.token, time.Unix(0, end), l.tickEvery())
			if !lost {
				b.f.leaseEnd.CompareAndSwap(end, until.UnixNano()) // unless renewed since
				return
			}
			l.mu.Lock()
			defer l.mu.Unlock()
			if _, live := l.live[b]; !live || b.f.leaseEnd.Load() != end {
				// settled or being completed, or renewed while this verdict was out:
				// stale
				return
			}
			h.stats.leaseLost.Add(1)
			h.met.leaseLost(opExtend)
			b.lost.Store(true)
			delete(l.live, b)
			if cancel, ok := l.running[b]; ok {
				cancel(ErrLeaseLost)
			}
		}()
	}
	wg.Wait()
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

// extend renews one claim. validUntil is when the lease ends as far as this process
// knows: the time the last successful claim or extension was sent, plus the lease.
// next is when the next attempt comes. It reports the lease lost when the store says
// so, or when a failed extension leaves the lease to end (less a margin of lease/6)
// before the next attempt; an attempt never runs into that margin. fn must stop
// before another owner can take the key, not after.
func (h *Handler) extend(rk, token string, validUntil time.Time, next time.Duration) (time.Time, bool) {
	margin := h.cfg.lease / 6 // stop fn this long before the lease can end
	sent := time.Now()
	left := validUntil.Sub(sent) - margin
	if left <= 0 {
		return validUntil, true
	}
	ctx, done := context.WithTimeout(context.Background(), min(h.cfg.lease/3, left))
	defer done()
	err := h.store.Extend(ctx, rk, token, h.cfg.lease)
	switch {
	case err == nil:
		return sent.Add(h.cfg.lease), false
	case errors.Is(err, ErrLeaseLost):
		return validUntil, true
	default:
		h.log.Debug("dedup: lease extension failed", "err", err)
		return validUntil, !time.Now().Add(next + margin).Before(validUntil)
	}
}
