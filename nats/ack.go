package nats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dedupkit/dedupkit/dedup"
)

// acker is what the adapter does to a delivery: jetstream.Msg has all of it; a legacy
// push message is adapted; a core message has no acks at all.
type acker interface {
	Ack() error
	DoubleAck(context.Context) error
	Nak() error
	NakWithDelay(time.Duration) error
	InProgress() error
	Term() error
}

// Action is what the adapter did with a delivery.
type Action uint8

const (
	// ActNone: no acknowledgement (LeaseLost, Cancelled, or a core NATS message); the
	// server redelivers after AckWait.
	ActNone Action = iota
	// ActAck: Ack (Processed, Duplicate, NotRecorded).
	ActAck
	// ActDoubleAck: Ack confirmed by the server (WithDoubleAck).
	ActDoubleAck
	// ActNak: Nak, redelivered at once (Panicked).
	ActNak
	// ActNakWithDelay: NakWithDelay (InProgress, Failed, StoreUnavailable).
	ActNakWithDelay
	// ActTerm: Term, never redelivered (NoKey, KeyReuse, the last delivery).
	ActTerm
	numActions
)

var actionNames = [numActions]string{"none", "ack", "double-ack", "nak", "nak-with-delay", "term"}

// String returns the action in lower case, e.g. "nak-with-delay".
func (a Action) String() string {
	if a < numActions {
		return actionNames[a]
	}
	return "invalid"
}

// ErrNoDeliveryLeft is what the exhausted hook receives for an outcome without an
// error of its own (InProgress on the last delivery, say).
var ErrNoDeliveryLeft = errors.New("nats: no delivery left")

// doubleAckTimeout bounds the wait for the server's confirmation of an ack.
const doubleAckTimeout = 5 * time.Second

// Reasons logged when a message is terminated. They are not sent with the Term,
// which some servers would then ignore (docs/nats.md).
const (
	ReasonNoKey     = "dedup: message has no key"
	ReasonKeyReuse  = "dedup: key reused with a different payload"
	ReasonExhausted = "dedup: no delivery left (handler failed, or could not run, on the last one)"
)

// Stats counts what an adapter did.
type Stats struct {
	actions [numActions]uint64
	// InProgress counts in-progress signals sent while handlers ran.
	InProgress uint64
	// AckErrors counts acknowledgements the server did not take.
	AckErrors uint64
	// Exhausted counts messages that failed on their last delivery.
	Exhausted uint64
	// Held counts copies held while another owner ran their key (DefaultCopyHold).
	Held uint64
}

// Count returns how many deliveries ended with action a.
func (s Stats) Count(a Action) uint64 {
	if a >= numActions {
		return 0
	}
	return s.actions[a]
}

type counters struct {
	actions    [numActions]atomic.Uint64
	inProgress atomic.Uint64
	ackErrors  atomic.Uint64
	exhausted  atomic.Uint64
	held       atomic.Uint64
}

func (c *counters) snapshot() Stats {
	var s Stats
	for i := range s.actions {
		s.actions[i] = c.actions[i].Load()
	}
	s.InProgress = c.inProgress.Load()
	s.AckErrors = c.ackErrors.Load()
	s.Exhausted = c.exhausted.Load()
	s.Held = c.held.Load()
	return s
}

// adapter is what the JetStream and core adapters share.
type adapter struct {
	h       *dedup.Handler
	cfg     config
	stats   counters
	running sync.WaitGroup // messages a Handler has taken and not yet settled
}

// dispatcher returns what runs handle for each message handed to a Handler: one at a
// time, waiting for each, when the adapter runs one message at a time, else on its own
// goroutine once one of the WithConcurrency slots is free. Blocking here, when all
// are busy, holds the client library's delivery back: its buffer, not ours, absorbs
// the flow.
func (a *adapter) dispatcher() func(handle func()) {
	if a.cfg.concurrency <= 1 {
		return func(handle func()) {
			a.running.Add(1)
			done := make(chan struct{})
			go func() { // not on the client library's goroutine: an fn's Goexit must not end it
				defer close(done)
				defer a.running.Done()
				defer a.recovered()
				handle()
			}()
			<-done
		}
	}
	slots := make(chan struct{}, a.cfg.concurrency)
	return func(handle func()) {
		a.running.Add(1) // before the wait for a slot, so that Wait covers it
		slots <- struct{}{}
		go func() {
			defer func() {
				a.running.Done()
				<-slots
			}()
			defer a.recovered()
			handle()
		}()
	}
}

// Wait blocks until every message already handed to a Handler has been handled and
// acknowledged. Stop (or drain) the subscription first, then call Wait before closing
// the Deduper or the connection.
func (a *adapter) Wait() { a.running.Wait() }

// Stats returns what the adapter has done so far.
func (a *adapter) Stats() Stats { return a.stats.snapshot() }

// action decides what to do with a delivery after its result. An outcome that needs
// another delivery (InProgress, Failed, Panicked, StoreUnavailable, CommitUnknown, LeaseLost,
// Cancelled) gets none after the last one (NumDelivered ≥ MaxDeliver): the server
// would drop the message silently, so it goes to the exhausted hook and is terminated.
func (a *adapter) action(m *Msg, res dedup.Result) (Action, time.Duration, string) {
	delay := func(d time.Duration) time.Duration { return max(d, DefaultMinDelay) }
	switch res.Outcome {
	case dedup.Processed, dedup.Duplicate, dedup.NotRecorded, dedup.First:
		if a.cfg.doubleAck {
			return ActDoubleAck, 0, ""
		}
		return ActAck, 0, ""
	case dedup.NoKey:
		return ActTerm, 0, ReasonNoKey
	case dedup.KeyReuse:
		return ActTerm, 0, ReasonKeyReuse
	}
	if a.lastDelivery(m) {
		return ActTerm, 0, ReasonExhausted
	}
	switch res.Outcome {
	case badInput.Outcome: // not run: a nil function or context (ErrBadInput)
		return ActNakWithDelay, delay(a.cfg.backoff(m.NumDelivered())), ""
	case dedup.InProgress:
		// after the hold (hold): a long run; retried after a growing delay, at most
		// what is left of its lease
		return ActNakWithDelay, delay(min(res.RetryAfter, a.cfg.backoff(m.NumDelivered()))), ""
	case dedup.Failed:
		return ActNakWithDelay, delay(a.cfg.backoff(m.NumDelivered())), ""
	case dedup.Panicked:
		return ActNak, 0, ""
	case dedup.StoreUnavailable:
		return ActNakWithDelay, delay(a.cfg.storeRetry), ""
	case dedup.CommitUnknown:
		return ActNakWithDelay, delay(res.RetryAfter), ""
	}
	return ActNone, 0, "" // LeaseLost, Cancelled: redelivered after AckWait
}

func (a *adapter) lastDelivery(m *Msg) bool {
	return a.cfg.maxDeliver > 0 && m.NumDelivered() >= uint64(a.cfg.maxDeliver)
}

// settle acknowledges one delivery according to its result.
func (a *adapter) settle(ctx context.Context, ack acker, m *Msg, res dedup.Result, herr error) Action {
	if res.Outcome == badInput.Outcome {
		a.cfg.logger.Error("dedup: message not run", append(a.where(m), "err", herr)...)
	}
	act, d, reason := a.action(m, res)
	if ack == nil { // core NATS: nothing to acknowledge
		act = ActNone
	}
	if reason == ReasonExhausted {
		if herr == nil {
			herr = fmt.Errorf("%w: %s on the last delivery", ErrNoDeliveryLeft, res.Outcome)
		}
		a.stats.exhausted.Add(1)
		if a.cfg.exhausted != nil {
			a.cfg.exhausted(ctx, m, herr)
		} else {
			// the outcome, not "failed": Close or a cancelled context ends a run too
			a.cfg.logger.Warn("dedup: not processed on the last delivery; terminating", append(a.where(m), "outcome", res.Outcome.String())...)
		}
	}
	var err error
	switch act {
	case ActAck:
		err = ack.Ack()
	case ActDoubleAck:
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), doubleAckTimeout)
		err = ack.DoubleAck(actx)
		cancel()
	case ActNak:
		err = ack.Nak()
	case ActNakWithDelay:
		err = ack.NakWithDelay(d)
	case ActTerm:
		if reason != ReasonExhausted { // exhausted: logged or handed to the hook above
			a.cfg.logger.Warn("dedup: terminating message", append(a.where(m), "reason", reason)...)
		}
		err = ack.Term()
	}
	a.stats.actions[act].Add(1)
	if err != nil {
		a.stats.ackErrors.Add(1)
		a.cfg.logger.Warn("dedup: acknowledgement failed", append(a.where(m), "action", act.String(), "err", err)...)
	}
	return act
}

// where names a delivery in a log line without its key or payload.
func (a *adapter) where(m *Msg) []any {
	attrs := []any{"handler", a.h.Name()}
	if md := m.Metadata(); md != nil {
		attrs = append(attrs, "stream", md.Stream, "stream_seq", strconv.FormatUint(md.Sequence.Stream, 10), "delivered", md.NumDelivered)
	}
	return attrs
}

// DefaultCopyHold is how long the adapter holds a copy of a message whose key
// another owner is running before it Naks it. It checks again after 50 ms, then
// at doubling intervals, so that the copy is answered soon after that run ends.
// On the message's last delivery it holds it until the owner's lease has passed.
const DefaultCopyHold = 2 * time.Second

// copyRecheck is the first interval between a held copy's checks.
const copyRecheck = 50 * time.Millisecond

// hold holds a copy (see DefaultCopyHold): res is its result so far, again checks it
// (and runs it) once more. The copy is kept in progress meanwhile. It returns the
// last result; ctx ending returns the one it has.
func (a *adapter) hold(ctx context.Context, ack acker, m *Msg, res dedup.Result, err error, again func(context.Context) (dedup.Result, error)) (dedup.Result, error) {
	if !heldCopy(res) || ack == nil || again == nil {
		return res, err
	}
	bound := DefaultCopyHold
	if a.lastDelivery(m) {
		bound = max(bound, res.RetryAfter+copyRecheck)
	}
	a.stats.held.Add(1) // held, however the hold ends
	start := time.Now()
	deadline := start.Add(bound)
	signalled := time.Time{}
	every := copyRecheck
	for heldCopy(res) {
		now := time.Now()
		left := deadline.Sub(now)
		if left <= 0 {
			break
		}
		if a.cfg.progressEvery <= 0 || now.Sub(signalled) >= a.cfg.progressEvery {
			if ack.InProgress() == nil {
				a.stats.inProgress.Add(1)
			}
			signalled = now
		}
		d := min(every, left)
		if res.RetryAfter > 0 {
			d = min(d, res.RetryAfter+time.Millisecond) // the owner's lease may end first
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return res, err
		}
		res, err = again(ctx)
		every *= 2
	}
	return res, err
}

// heldCopy says res is a copy the adapter holds: InProgress under another owner's
// claim, as the store reported it.
func heldCopy(res dedup.Result) bool {
	return res.Outcome == dedup.InProgress && res.Tier == dedup.TierStore
}

// progress sends InProgress for a set of deliveries every interval until stopped, so
// that handlers (and batch items waiting their turn) outlive AckWait.
type progress struct {
	a     *adapter
	every time.Duration
	mu    sync.Mutex
	acks  []acker // by delivery; nil once finished
	timer *time.Timer
	done  bool
}

func (a *adapter) startProgress(every time.Duration, acks []acker) *progress {
	p := &progress{a: a, every: every, acks: acks}
	if every > 0 && len(acks) > 0 {
		p.mu.Lock() // tick reads p.timer, and may run before AfterFunc returns
		p.timer = time.AfterFunc(every, p.tick)
		p.mu.Unlock()
	}
	return p
}

func (p *progress) tick() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return
	}
	for _, ack := range p.acks {
		if ack != nil && ack.InProgress() == nil {
			p.a.stats.inProgress.Add(1)
		}
	}
	p.timer.Reset(p.every)
}

// finish stops signalling for delivery i (it is about to be acknowledged).
func (p *progress) finish(i int) {
	p.mu.Lock()
	p.acks[i] = nil
	p.mu.Unlock()
}

func (p *progress) stop() {
	p.mu.Lock()
	p.done = true
	if p.timer != nil {
		p.timer.Stop()
	}
	p.mu.Unlock()
}
