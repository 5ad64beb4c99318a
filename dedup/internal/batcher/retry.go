package batcher

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
)

// Completions that failed for want of the store are sent again in the background
// until it answers them, their claim's lease ends (the call's deadline), or Close.
// Once fn has succeeded DONE is true whoever holds the key now (docs/design.md §3),
// and while the lease lasts no other run can take the key, so a redelivery after a
// short outage finds DONE, not a free key. The breaker's probe also sends up to
// maxBatch of them once before it closes the breaker. The caller has its answer
// already (NotRecorded): nothing waits for these.
const (
	retryFirst = 50 * time.Millisecond // then doubling, up to probeMax; each send is cut at probeMax
	// maxRetries and maxRetryBytes (their replies) bound the completions waiting to be
	// sent again; more are dropped
	maxRetries    = 1 << 16
	maxRetryBytes = 64 << 20
)

// retries holds the completions to send again, and their goroutine's state.
type retries struct {
	mu      sync.Mutex
	pending []retryEntry
	bytes   int           // the pending entries' replies
	dropped int           // not taken since the goroutine started: the bound was full
	done    chan struct{} // closed when the goroutine ends; nil when none runs
	closed  bool          // Wait has begun: nothing more is taken
	wake    chan struct{} // the breaker's probe got an answer: try now
}

type retryEntry struct {
	e        driver.Entry
	deadline time.Time
}

// retryable reports whether completions whose store call failed with err may land if
// sent again: the store did not answer the call, as opposed to refusing it or the
// engine giving up (Close). An entry's own error (an error reply, a lost lease, too
// few replicas) is an answer, and is not retried.
func retryable(err error) bool {
	return errors.Is(err, driver.ErrStoreUnavailable) && !errors.Is(err, driver.ErrLeaseLost) &&
		!errors.Is(err, driver.ErrBadRecord) && !errors.Is(err, driver.ErrInvalidOption) &&
		!errors.Is(err, driver.ErrClosed)
}

// retryLater takes completions whose store call failed (retryable), to send again
// until deadline, their call's: a run's completion has its claim's lease.
func (g *Store) retryLater(entries []driver.Entry, deadline time.Time) {
	if !time.Now().Before(deadline) {
		return
	}
	r := &g.retry
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || g.cfg.Closing == nil || g.cfg.Closing.Err() != nil {
		return
	}
	for _, e := range entries {
		if len(r.pending) >= maxRetries || r.bytes+len(e.Reply) > maxRetryBytes {
			if r.dropped++; r.dropped == 1 {
				g.cfg.Logger.Warn("dedup: too many completions to retry; not retrying more (their runs are NotRecorded)", "max", maxRetries)
			}
			continue
		}
		r.pending = append(r.pending, retryEntry{e: e, deadline: deadline})
		r.bytes += len(e.Reply)
	}
	g.loopLocked()
}

// loopLocked starts the goroutine that sends the pending completions again, unless
// it runs, none is pending or Close has begun. r.mu is held.
func (g *Store) loopLocked() {
	r := &g.retry
	if r.done != nil || len(r.pending) == 0 || r.closed || g.cfg.Closing.Err() != nil {
		return
	}
	r.done = make(chan struct{})
	if r.wake == nil {
		r.wake = make(chan struct{}, 1)
	}
	go g.retryLoop(r.done, r.wake)
}

// retryLoop sends the pending completions again at growing intervals, while any
// are left, until Closing ends.
func (g *Store) retryLoop(done chan struct{}, wake <-chan struct{}) {
	defer close(done)
	every := retryFirst
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-g.cfg.Closing.Done():
			g.endRetries()
			return
		case <-t.C:
		case <-wake:
		}
		if g.retryNow(g.cfg.Closing) {
			every = retryFirst
		} else {
			every = min(2*every, probeMax)
		}
		r := &g.retry
		r.mu.Lock()
		if len(r.pending) == 0 {
			r.done, r.dropped = nil, 0 // a probe's batch that fails again starts a new one
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		t.Reset(every)
	}
}

// retryNow sends the pending completions once, up to maxBatch a store call, and
// keeps those that failed again; it reports whether the store answered. The breaker's
// probe calls it before claims resume, so that a redelivery finds DONE.
func (g *Store) retryNow(ctx context.Context) bool {
	r := &g.retry
	r.mu.Lock()
	now := time.Now()
	var batch []retryEntry
	var expired int
	keep := r.pending[:0]
	for _, p := range r.pending {
		switch {
		case !now.Before(p.deadline):
			expired++
			r.bytes -= len(p.e.Reply)
		case len(batch) < maxBatch:
			batch = append(batch, p)
			r.bytes -= len(p.e.Reply)
		default:
			keep = append(keep, p)
		}
	}
	clear(r.pending[len(keep):])
	r.pending = keep
	r.mu.Unlock()
	if expired > 0 {
		g.cfg.Logger.Warn("dedup: processed; DONE not written before the claims' leases ended (the store did not answer)", "completions", expired)
	}
	if len(batch) == 0 {
		return true
	}
	entries := make([]driver.Entry, len(batch))
	for i, p := range batch {
		entries[i] = p.e
	}
	sctx, cancel := context.WithTimeout(ctx, probeMax) // a silent store: try again later
	// Detached: a store that ignores its context holds neither this goroutine nor Close
	as, err := Detached(g.Quiet(), sctx, "complete", func(ctx context.Context) ([]driver.Answer, error) {
		return g.completes.send(ctx, entries)
	})
	cancel()
	if err == nil && len(as) != len(entries) {
		err = driver.ErrStoreUnavailable
	}
	var again []retryEntry
	landed := 0
	for i, p := range batch {
		switch {
		case err != nil:
			if retryable(err) {
				again = append(again, p)
			}
		case as[i].Err == nil:
			landed++
		}
	}
	if landed > 0 {
		g.cfg.Logger.Info("dedup: DONE written on a retry after the store failed", "completions", landed)
	}
	r.mu.Lock()
	r.pending = append(r.pending, again...)
	for _, p := range again {
		r.bytes += len(p.e.Reply)
	}
	g.loopLocked() // the probe's batch: no goroutine may be running
	r.mu.Unlock()
	return err == nil
}

// endRetries drops the pending completions at Close, with one log line.
func (g *Store) endRetries() {
	r := &g.retry
	r.mu.Lock()
	n := len(r.pending)
	r.pending, r.bytes, r.dropped, r.done = nil, 0, 0, nil
	r.mu.Unlock()
	if n > 0 {
		g.cfg.Logger.Warn("dedup: closed with completions still to retry; not written (their runs were NotRecorded, or committed: their markers answer)", "completions", n)
	}
}

// retryWake has the retries go now (the breaker's probe got an answer).
func (g *Store) retryWake() {
	r := &g.retry
	r.mu.Lock()
	w := r.wake
	r.mu.Unlock()
	if w != nil {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

// waitRetries stops taking completions and waits, up to CloseWait, for the goroutine
// that retries them (Closing has ended: it leaves).
func (g *Store) waitRetries() {
	r := &g.retry
	r.mu.Lock()
	r.closed = true
	done := r.done
	r.mu.Unlock()
	if done == nil {
		return
	}
	t := time.NewTimer(CloseWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}
