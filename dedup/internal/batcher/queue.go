package batcher

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
)

// The batcher: one queue per store operation for the whole Deduper. Concurrent
// callers' entries, whatever their handler, go to the store together: while fewer
// than InFlight calls are out a caller's entries go at once, with whatever has
// queued; otherwise they wait for the next call to end (docs/design.md §3). Each
// caller still returns by its own deadline: the call it gave up on goes on, and a
// claim that lands for nobody is given back.
const (
	// CloseWait is how long Close waits for the store calls still out: a call sent
	// from its caller's goroutine (sendAlone) is cut short at it.
	CloseWait = time.Second
	// InFlight is how many store calls of an operation are out at once.
	InFlight = 4
	// maxBatch is how many entries a store call holds, unless one caller's are more.
	maxBatch = 128
)

// A lazy completion (a committed run's: its marker answers a redelivery, so nothing
// waits for it) waits up to LazyDelay for company, unless lazyBatch are queued or an
// eager one comes: then committed runs share a round trip.
const (
	// LazyDelay is how long a lazy completion waits for company.
	LazyDelay = 10 * time.Millisecond
	lazyBatch = 32
)

// queue is one operation's batcher.
type queue struct {
	g     *Store
	op    string
	entry bool // a claim or a mark: refused while the breaker is open
	// giveBack: an entry acquired for a caller that gave up is released (claims)
	giveBack bool
	// retry: an entry the store did not answer is sent again later (completions)
	retry bool
	send  func(context.Context, []driver.Entry) ([]driver.Answer, error)

	mu       sync.Mutex
	calls    []*call
	flushers int
	// idle flushers wait on wake for work, up to InFlight of them, until Closing ends:
	// a new goroutine would grow its stack in the client at every call
	idle     int
	wake     chan struct{}
	idleDone sync.Cond   // signalled when a flusher stops waiting (Store.Wait)
	alone    int         // calls sent from their caller's goroutine, out now (sendAlone)
	eager    bool        // calls holds a call that is not lazy
	timer    *time.Timer // set while lazy calls wait for company
}

// call is one caller's entries and, once answered, the store's answers to them.
type call struct {
	vals     context.Context // for its values (tracing): not its cancellation
	deadline time.Time       // of the store call; zero: none
	entries  []driver.Entry
	answers  []driver.Answer
	err      error
	state    callState // under queue.mu
	done     chan struct{}
	// to, when set, takes the answer instead of a waiting caller (a completion)
	to   Answerer
	lazy bool
	one  [1]driver.Entry // a completion's entry: its entries, without an allocation
}

type callState uint8

const (
	queued callState = iota
	sent
	gaveUp
	answered
)

// Answerer takes the store's answer to a completion sent with CompleteLater. An
// interface, so that a batch item costs no closure.
type Answerer interface{ CompletionAnswered(cerr error) }

func newQueue(g *Store, op string, entry bool, send func(context.Context, []driver.Entry) ([]driver.Answer, error)) *queue {
	q := &queue{g: g, op: op, entry: entry, send: send, wake: make(chan struct{}, InFlight)}
	q.idleDone.L = &q.mu
	return q
}

// asAnswers adapts a store operation that answers errors to the queue's answers.
func asAnswers(f func(context.Context, []driver.Entry) ([]error, error)) func(context.Context, []driver.Entry) ([]driver.Answer, error) {
	return func(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
		errs, err := f(ctx, entries)
		if err != nil {
			return nil, err
		}
		as := make([]driver.Answer, len(errs))
		for i, e := range errs {
			as[i].Err = e
		}
		return as, nil
	}
}

// do sends entries with the other callers' and returns the store's answers, or an
// error wrapping driver.ErrStoreUnavailable once ctx (or its wait bound) ends, Close has
// waited closeWait, or, for a claim or mark, the breaker opens. An in-process store
// is called at once: it answers in far less than a round trip.
func (q *queue) do(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	g := q.g
	if q.entry {
		if err := g.refused(q.op); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil { // a store would not send it either: one answer for all
		return nil, fmt.Errorf("%w: %s: not sent: %w", driver.ErrStoreUnavailable, q.op, context.Cause(ctx))
	}
	if !g.detach {
		as, err := q.send(ctx, entries)
		g.note(ctx, q.entry, err)
		return as, err
	}
	if q.entry && g.honours && g.fails.Load() == 0 && boundOf(ctx) == ctx && !closed(g.cfg.Abandon) && q.goAlone() {
		return q.sendAlone(ctx, entries)
	}
	c := &call{vals: ctx, entries: entries, done: make(chan struct{})}
	c.deadline, _ = ctx.Deadline()
	q.add(c)
	cause := g.wait(c.done, boundOf(ctx), q.entry)
	if cause == nil {
		return c.answers, c.err
	}
	q.mu.Lock()
	st := c.state
	if st != answered {
		c.state = gaveUp
	}
	q.mu.Unlock()
	if st == answered { // answered meanwhile: the answer wins
		<-c.done
		return c.answers, c.err
	}
	if q.entry && cause != driver.ErrClosed && errors.Is(cause, context.DeadlineExceeded) {
		g.failed() // a store that does not answer by the deadline counts as failing
	}
	what := "no answer"
	if st == queued {
		what = "not sent"
	}
	return nil, fmt.Errorf("%w: %s: %s: %w", driver.ErrStoreUnavailable, q.op, what, cause)
}

// sendAlone sends a lone caller's entries from its goroutine: the store ends the call
// by ctx's deadline, or CloseWait from now if that is sooner (deadlineHonourer), and
// no failure since its last answer says it may take that long. Callers that come
// meanwhile go as usual, watched for stalls. Its caller has the answer, whatever it
// is: the engine gives back a claim that failed (it may have landed).
func (q *queue) sendAlone(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > CloseWait {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, CloseWait)
		defer cancel()
	}
	as, err := q.send(ctx, entries)
	if err == nil && len(as) != len(entries) {
		err = fmt.Errorf("%w: %s: %d answers to %d entries", driver.ErrStoreUnavailable, q.op, len(as), len(entries))
	}
	q.g.note(ctx, q.entry, err)
	q.mu.Lock()
	q.alone--
	q.mu.Unlock()
	return as, err
}

// CompleteLater sends the completion e with the other callers' entries, within
// timeout; to gets the answer. Lazy: it may wait LazyDelay for company.
func (g *Store) CompleteLater(ctx context.Context, e driver.Entry, timeout time.Duration, to Answerer, lazy bool) {
	c := &call{vals: ctx, deadline: time.Now().Add(timeout), to: to, lazy: lazy}
	c.one[0] = e
	c.entries = c.one[:]
	g.completes.add(c)
}

// goAlone counts a call out alone and reports true when nothing is queued or out:
// its caller sends it (sendAlone).
func (q *queue) goAlone() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	alone := q.flushers == 0 && q.alone == 0 && len(q.calls) == 0
	if alone {
		q.alone++
	}
	return alone
}

// add queues c for a flusher.
func (q *queue) add(c *call) {
	q.mu.Lock()
	q.calls = append(q.calls, c)
	q.eager = q.eager || !c.lazy
	spawn := q.flushers < InFlight && (q.eager || len(q.calls) >= lazyBatch)
	switch {
	case spawn && q.idle > 0:
		q.flushers++
		q.idle--
		q.wake <- struct{}{} // never blocks: one token per idle flusher at most
		spawn = false
	case spawn:
		q.flushers++
	case q.flushers == 0 && q.timer == nil:
		// lazy ones only, and no call out that will take them when it ends
		q.timer = time.AfterFunc(LazyDelay, q.kick)
	}
	q.mu.Unlock()
	if spawn {
		go q.flush()
	}
}

// closed reports whether c is closed.
func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// kick sends the lazy calls that waited LazyDelay, unless a flush took them.
func (q *queue) kick() {
	q.mu.Lock()
	q.timer = nil
	spawn := len(q.calls) > 0 && q.flushers < InFlight
	if spawn {
		q.flushers++
	}
	q.mu.Unlock()
	if spawn {
		q.flush()
	}
}

// flush sends the queued calls, up to maxBatch entries a store call, until none is
// left. A call of one caller's entries runs in its context; otherwise the callers'
// contexts do not cancel it, and its deadline is their latest.
func (q *queue) flush() {
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	batch, entries := sc.batch, sc.entries
	defer func() { sc.batch, sc.entries = batch[:0], entries[:0] }()
	for {
		batch, entries = batch[:0], entries[:0]
		var deadline time.Time
		q.mu.Lock()
		taken := 0
		for _, c := range q.calls {
			if len(entries) > 0 && len(entries)+len(c.entries) > maxBatch {
				break
			}
			taken++
			if c.state == gaveUp { // before it was sent: nothing to do
				continue
			}
			c.state = sent
			batch = append(batch, c)
			entries = append(entries, c.entries...) // the caller may reuse its slice once it gave up
			if len(batch) == 1 || (!deadline.IsZero() && (c.deadline.IsZero() || c.deadline.After(deadline))) {
				deadline = c.deadline
			}
		}
		rest := copy(q.calls, q.calls[taken:])
		clear(q.calls[rest:])
		q.calls = q.calls[:rest]
		q.eager = false
		for _, c := range q.calls {
			q.eager = q.eager || !c.lazy
		}
		if taken == 0 {
			q.flushers--
			woken := q.park()
			q.mu.Unlock()
			if !woken {
				return
			}
			continue
		}
		q.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		ctx, cancel := batch[0].vals, context.CancelFunc(func() {})
		if len(batch) > 1 || batch[0].to != nil {
			// the first one's values (the others' are alike), not its cancellation
			ctx = context.WithoutCancel(ctx)
			if !deadline.IsZero() {
				ctx, cancel = context.WithDeadline(ctx, deadline)
			}
		}
		var stall *time.Timer
		if q.entry {
			stall = time.AfterFunc(StallAfter, q.g.stalled(len(batch)))
		}
		as, err := q.send(ctx, entries)
		if stall != nil {
			stall.Stop()
		}
		if err == nil && len(as) != len(entries) {
			err = fmt.Errorf("%w: %s: %d answers to %d entries", driver.ErrStoreUnavailable, q.op, len(as), len(entries))
		}
		q.g.note(ctx, q.entry, err)
		cancel()
		q.answer(batch, entries, as, err)
		clear(batch)
		clear(entries)
	}
}

// park waits, holding q.mu when called and on return, for work (true: add counted
// the flusher again) or Closing's end (false). A flusher parks only while fewer than
// InFlight are idle and the Deduper is open.
func (q *queue) park() bool {
	closing := q.g.cfg.Closing
	if closing == nil || closing.Err() != nil || q.idle >= InFlight {
		return false
	}
	q.idle++
	q.mu.Unlock()
	woken := false
	select {
	case <-q.wake:
		woken = true
	case <-closing.Done():
	}
	q.mu.Lock()
	if !woken {
		select {
		case <-q.wake: // add counted it meanwhile
			woken = true
		default:
			q.idle--
		}
	}
	q.idleDone.Broadcast()
	return woken
}

// waitIdle waits until no flusher is parked: after Closing has ended, they all leave.
func (q *queue) waitIdle() {
	q.mu.Lock()
	for q.idle > 0 {
		q.idleDone.Wait()
	}
	q.mu.Unlock()
}

// scratch is a flusher's buffers, kept between flushes.
type scratch struct {
	batch   []*call
	entries []driver.Entry
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// answer hands each call its answers. A claim whose caller gave up is given back; the
// completions of a store call that failed are sent again (retryLater).
func (q *queue) answer(batch []*call, entries []driver.Entry, as []driver.Answer, err error) {
	var back []driver.Entry
	off := 0
	q.mu.Lock()
	for _, c := range batch {
		n := len(c.entries)
		var mine []driver.Answer
		if err == nil {
			mine = as[off : off+n : off+n]
		}
		if q.retry && err != nil && retryable(err) {
			q.g.retryLater(entries[off:off+n], c.deadline)
		}
		if c.state == gaveUp && q.giveBack {
			for j := range n {
				if err != nil || mine[j].Err != nil || mine[j].Status == driver.StatusAcquired {
					back = append(back, entries[off+j])
				}
			}
		} else if c.state != gaveUp {
			c.answers, c.err, c.state = mine, err, answered
		}
		off += n
	}
	q.mu.Unlock()
	for _, c := range batch {
		switch {
		case c.state != answered:
		case c.to != nil:
			cerr := c.err
			if cerr == nil {
				cerr = c.answers[0].Err
			}
			c.to.CompletionAnswered(cerr)
		default:
			close(c.done)
		}
	}
	q.g.giveBack(back)
}

// Queued returns how many calls of operation op ("claim", "mark", ...) wait in its
// queue.
func (g *Store) Queued(op string) int {
	for _, q := range []*queue{g.claims, g.marks, g.completes, g.extends, g.releases} {
		if q.op == op {
			q.mu.Lock()
			defer q.mu.Unlock()
			return len(q.calls)
		}
	}
	return 0
}
