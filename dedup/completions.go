package dedup

import (
	"context"
	"sync"
)

// completionsInFlight is how many completion round trips (CompleteMany) a handler
// has out at once; the completions that come meanwhile queue and go together in the
// next. maxCompletions bounds one round trip.
const (
	completionsInFlight = DefaultPipelinesInFlight
	maxCompletions      = DefaultPipelineBatch
)

// completions coalesces a handler's completions that need not hold their caller:
// those of batch items (completer), and those of committed transactional runs
// (completeCommitted). A completion goes out at once, on a goroutine that then sends
// whatever has queued meanwhile, while fewer than completionsInFlight round trips
// are out; otherwise it queues, and the next round trip to end takes it. So a
// completion waits at most for a round trip to end, never for the rest of its batch,
// and concurrent batches and runs share pipelines. No timer, and no goroutine
// outlives the completions that need it (whoever adds one waits for its answer, or
// counts it in the Deduper's running, which Close waits for).
type completions struct {
	h        *Handler
	mu       sync.Mutex
	queue    []pendingCompletion
	flushers int
}

// pendingCompletion is the completion of c's claim; answered gets the store's answer.
type pendingCompletion struct {
	ctx      context.Context // for its values (tracing): not its cancellation
	c        claimed
	answered func(cerr error)
}

func (q *completions) add(p pendingCompletion) {
	q.mu.Lock()
	q.queue = append(q.queue, p)
	spawn := q.flushers < completionsInFlight
	if spawn {
		q.flushers++
	}
	q.mu.Unlock()
	if spawn {
		go q.flush()
	}
}

// flush sends the queue, maxCompletions at a time, until it is empty.
func (q *completions) flush() {
	h := q.h
	var batch []pendingCompletion
	var entries []Entry
	for {
		q.mu.Lock()
		n := min(len(q.queue), maxCompletions)
		if n == 0 {
			q.flushers--
			q.mu.Unlock()
			return
		}
		batch = append(batch[:0], q.queue[:n]...)
		rest := copy(q.queue, q.queue[n:])
		clear(q.queue[rest:])
		q.queue = q.queue[:rest]
		q.mu.Unlock()

		entries = entries[:0]
		for _, p := range batch {
			entries = append(entries, Entry{Key: p.c.rk, Token: p.c.token, TTL: h.cfg.retention})
		}
		// the first one's context, for its values: the others' are alike
		ctx, done := context.WithTimeout(context.WithoutCancel(batch[0].ctx), h.cfg.lease)
		errs, err := h.d.store.CompleteMany(ctx, entries)
		done()
		for j, p := range batch {
			cerr := err
			if err == nil {
				cerr = errs[j]
			}
			p.answered(cerr)
		}
		clear(batch)
	}
}
