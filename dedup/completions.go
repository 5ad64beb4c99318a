package dedup

import (
	"context"
	"sync"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
)

// completionsInFlight is how many completion round trips a handler has out at once;
// maxCompletions bounds the entries of one.
const (
	completionsInFlight = 4
	maxCompletions      = 128
)

// A lazy completion (a committed run's: its marker answers a redelivery, so nothing
// waits for it) waits up to lazyDelay for company, unless lazyBatch are queued or an
// eager one comes, so that a handler's runs share a round trip.
const (
	lazyDelay = 2 * time.Millisecond
	lazyBatch = 32
)

// completions coalesces the completions of a handler's batch items (completer) and
// committed runs (completeCommitted). While fewer than completionsInFlight round
// trips are out, a completion goes out at once, with whatever has queued; otherwise it
// queues for the next round trip to end. Only lazy completions use a timer.
type completions struct {
	h        *Handler
	mu       sync.Mutex
	queue    []pendingCompletion
	eager    bool        // the queue holds an eager completion
	timer    *time.Timer // set while lazy completions wait for company
	flushers int
}

// pendingCompletion is a claim's completion; to gets the store's answer.
type pendingCompletion struct {
	ctx  context.Context // for its values (tracing): not its cancellation
	e    driver.Entry
	lazy bool // may wait lazyDelay for company
	to   completionAnswer
}

// completionAnswer takes the store's answer to a completion: a batchItem or a
// committedRun. An interface, so that a batch item costs no closure.
type completionAnswer interface{ completionAnswered(cerr error) }

// pendingFor is the completion of c's claim, answered to to.
func pendingFor(ctx context.Context, c *claimed, lazy bool, to completionAnswer) pendingCompletion {
	p := pendingCompletion{ctx: ctx, e: driver.Entry{Key: c.rk, Token: c.token}, lazy: lazy, to: to}
	if c.storesReply() { // a reply batch's item carries its reply here, to its DONE record
		p.e.Reply, p.e.HasReply = c.reply, true
	}
	return p
}

// flushScratch is a flusher's buffers, kept between flushes.
type flushScratch struct {
	batch   []pendingCompletion
	entries []driver.Entry
}

var flushScratchPool = sync.Pool{New: func() any { return new(flushScratch) }}

func (q *completions) add(p pendingCompletion) {
	q.mu.Lock()
	q.queue = append(q.queue, p)
	q.eager = q.eager || !p.lazy
	spawn := q.flushers < completionsInFlight && (q.eager || len(q.queue) >= lazyBatch)
	switch {
	case spawn:
		q.flushers++
	case q.flushers == 0 && q.timer == nil:
		// lazy ones only, and no round trip out that will take them when it ends
		q.timer = time.AfterFunc(lazyDelay, q.kick)
	}
	q.mu.Unlock()
	if spawn {
		go q.flush()
	}
}

// kick sends the lazy completions that waited lazyDelay, unless a flush took them.
func (q *completions) kick() {
	q.mu.Lock()
	q.timer = nil
	spawn := len(q.queue) > 0 && q.flushers < completionsInFlight
	if spawn {
		q.flushers++
	}
	q.mu.Unlock()
	if spawn {
		q.flush()
	}
}

// flush sends the queue, maxCompletions at a time, until it is empty.
func (q *completions) flush() {
	h := q.h
	sc := flushScratchPool.Get().(*flushScratch)
	batch, entries := sc.batch, sc.entries
	for {
		q.mu.Lock()
		n := min(len(q.queue), maxCompletions)
		if n == 0 {
			q.flushers--
			q.mu.Unlock()
			sc.batch, sc.entries = batch[:0], entries[:0]
			flushScratchPool.Put(sc)
			return
		}
		batch = append(batch[:0], q.queue[:n]...)
		rest := copy(q.queue, q.queue[n:])
		clear(q.queue[rest:])
		q.queue = q.queue[:rest]
		q.eager = false
		for _, p := range q.queue {
			q.eager = q.eager || !p.lazy
		}
		q.mu.Unlock()

		entries = entries[:0]
		for _, p := range batch {
			e := p.e
			e.TTL = h.cfg.retention
			entries = append(entries, e)
		}
		// the first one's context, for its values: the others' are alike
		ctx, done := context.WithTimeout(context.WithoutCancel(batch[0].ctx), h.cfg.lease)
		errs, err := h.store.Complete(ctx, entries)
		done()
		for j, p := range batch {
			cerr := err
			if err == nil {
				cerr = errs[j]
			}
			p.to.completionAnswered(cerr)
		}
		clear(batch)
		clear(entries)
	}
}
