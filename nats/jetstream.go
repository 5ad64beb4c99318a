package nats

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedupkit/dedup"
)

// Func is a handler: it gets a context (cancelled on shutdown or a lost lease) and a
// read-only view of the message, and returns an error to have it retried.
type Func func(ctx context.Context, m *Msg) error

// JetStream runs one dedup handler on the messages of one JetStream consumer.
type JetStream struct {
	adapter
}

// NewJetStream wraps h for the messages of consumer c, whose config it reads. It
// refuses a consumer without AckExplicitPolicy, a retention shorter than the
// consumer's redelivery horizon (CheckRetention), and unlimited redelivery
// without WithUnlimitedRedelivery. Errors wrap dedup.ErrInvalidOption.
func NewJetStream(h *dedup.Handler, c jetstream.Consumer, opts ...Option) (*JetStream, error) {
	cfg, err := newConfig(h, opts)
	if err != nil {
		return nil, err
	}
	if c == nil {
		return nil, invalid("consumer is nil")
	}
	info := c.CachedInfo()
	if info == nil {
		return nil, invalid("consumer has no cached info")
	}
	cc := info.Config
	if cc.AckPolicy != jetstream.AckExplicitPolicy {
		// AckAll would let a later Ack confirm an earlier Nak'ed message; AckNone
		// cannot redeliver at all.
		return nil, invalid("consumer %q has ack policy %v; dedup needs AckExplicitPolicy", info.Name, cc.AckPolicy)
	}
	if err := CheckRetention(h.Retention(), cc, cfg.unlimited); err != nil {
		return nil, fmt.Errorf("handler %q on consumer %q: %w", h.Name(), info.Name, err)
	}
	cfg.maxDeliver = cc.MaxDeliver
	if cfg.progressEvery == 0 {
		ackWait := cc.AckWait
		if ackWait <= 0 {
			ackWait = defaultAckWait
		}
		cfg.progressEvery = ackWait / 3
	}
	return &JetStream{adapter{h: h, cfg: cfg}}, nil
}

const defaultAckWait = 30_000_000_000 // the server's default AckWait, 30s

// Handler returns a jetstream.MessageHandler for Consumer.Consume. It runs up to
// WithConcurrency messages at once: those that arrive while earlier ones are
// being checked are checked together, in one store round trip, and each is
// acknowledged as soon as its own result is final. A message whose key another
// is running waits for that run's end. WithConcurrency(1) runs messages one by
// one, in delivery order. ctx is the handlers' parent: cancel it to shut down,
// leaving running messages for redelivery. After stopping the consumer, call Wait.
//
// Pass Consume a short idle heartbeat, such as jetstream.PullHeartbeat(time.Second):
// without one, nats.go's Consume can stall for about 30 s (docs/nats.md).
func (j *JetStream) Handler(ctx context.Context, fn Func) jetstream.MessageHandler {
	if j == nil {
		return noAdapter
	}
	if fn == nil || ctx == nil {
		return j.refuse
	}
	ctx = dedup.WaitForRunning(ctx)
	var handle jetstream.MessageHandler
	if j.cfg.concurrency > 1 {
		handle = j.batcher(ctx, fn)
	} else {
		handle = j.one(ctx, fn)
	}
	var once sync.Once
	var firstLate atomic.Int64 // unix nanos: the first message after ctx ended
	return func(msg jetstream.Msg) {
		select {
		case <-ctx.Done(): // it is Cancelled: left unacknowledged, for redelivery after AckWait
			now := time.Now().UnixNano()
			if !firstLate.CompareAndSwap(0, now) && now-firstLate.Load() >= int64(lateWarning) {
				once.Do(func() {
					j.cfg.logger.Warn("dedup: the consumer still delivers a second after the handler's context ended; "+
						"those messages are left for redelivery after AckWait: stop the consumer when you cancel", "handler", j.h.Name())
				})
			}
		default:
		}
		handle(msg)
	}
}

// lateWarning is how long after the first message that finds the Handler's context
// ended one more makes Handler warn: the consumer was not stopped (a shutdown's last
// deliveries come sooner).
const lateWarning = time.Second

// one is Handler with concurrency 1: messages run one at a time, in delivery order.
func (j *JetStream) one(ctx context.Context, fn Func) jetstream.MessageHandler {
	dispatch := j.dispatcher()
	return func(msg jetstream.Msg) {
		if isNil(msg) {
			j.cfg.logger.Error("dedup: nil message handed to the handler; dropped", "handler", j.h.Name())
			return
		}
		dispatch(func() {
			defer j.nakOnPanic(msg)
			j.Handle(ctx, msg, fn)
		})
	}
}

// refuse is the MessageHandler of a Handler given a nil function or context: each
// message is logged and Nak'ed after the failure backoff (ErrBadInput).
func (j *JetStream) refuse(msg jetstream.Msg) {
	if isNil(msg) {
		j.cfg.logger.Error("dedup: nil message handed to the handler; dropped", "handler", j.h.Name())
		return
	}
	j.settle(context.Background(), msg, viewJS(msg), badInput, ErrBadInput)
}

// Micro-batching of Handler: at most batchesInFlight batches are being taken from the
// queue and checked at once, of at most maxBatch messages each.
const (
	batchesInFlight = 4
	maxBatch        = 128
)

// batcher is Handler with concurrency above 1. Each message takes a slot and
// joins a queue; while fewer than batchesInFlight batches are being checked, a
// goroutine takes up to maxBatch queued messages as one batch and hands its turn
// on once their checks are in, so that slow fns and messages waiting for another's
// run hold only their own slots. There is no timer: a lone message goes out at once.
// The batches run on workers kept while messages come (workers).
func (j *JetStream) batcher(ctx context.Context, fn Func) jetstream.MessageHandler {
	slots := make(chan struct{}, j.cfg.concurrency)
	var mu sync.Mutex
	var queue []jetstream.Msg
	marking := 0 // goroutines holding a turn: taking the queue or waiting for marks
	w := &workers{wake: make(chan struct{}, batchesInFlight), done: ctx.Done()}
	free := func(int) {
		<-slots
		j.running.Done()
	}
	// handOver gives up a turn; if messages wait, another goroutine takes it.
	handOver := func() {
		mu.Lock()
		marking--
		more := len(queue) > 0 && marking < batchesInFlight
		if more {
			marking++
		}
		mu.Unlock()
		if more {
			w.start()
		}
	}
	// drain takes up to maxBatch queued messages and handles them as one batch. Its
	// turn goes on once the batch's checks are in (WhenChecked, which every batch
	// reaches, also when an fn ends this goroutine), or at the latest when it returns.
	w.drain = func() {
		defer j.recovered()
		var holding atomic.Bool // this goroutine holds a turn
		holding.Store(true)
		give := func() {
			if holding.CompareAndSwap(true, false) {
				handOver()
			}
		}
		defer give()
		mu.Lock()
		n := min(len(queue), maxBatch)
		msgs := slices.Clone(queue[:n])
		queue = slices.Delete(queue, 0, n)
		mu.Unlock()
		if n > 0 { // another took them meanwhile otherwise
			j.handleMsgs(dedup.WhenChecked(ctx, give), msgs, j.cfg.concurrency, fn, free) // each message's slot as it is settled
		}
	}
	return func(msg jetstream.Msg) {
		if isNil(msg) {
			j.cfg.logger.Error("dedup: nil message handed to the handler; dropped", "handler", j.h.Name())
			return
		}
		j.running.Add(1) // before the wait for a slot, so that Wait covers it
		slots <- struct{}{}
		mu.Lock()
		queue = append(queue, msg)
		start := marking < batchesInFlight
		if start {
			marking++
		}
		mu.Unlock()
		if start {
			w.start()
		}
	}
}

// workers runs the batcher's drain on goroutines kept between batches: a new
// goroutine would grow its stack in the Redis client at every batch. Up to
// batchesInFlight wait idle, each for idleWorker at most or until done closes.
type workers struct {
	drain func()
	done  <-chan struct{}
	mu    sync.Mutex
	idle  int           // parked workers not yet told to drain
	wake  chan struct{} // a token per worker told to drain: idle+len(wake) <= batchesInFlight
}

// idleWorker is how long, in nanoseconds, a worker waits for the next batch before
// it ends: 100 ms (a variable for tests).
var idleWorker atomic.Int64

func init() { idleWorker.Store(int64(100 * time.Millisecond)) }

// parkedHook, when set (by tests only), is called with the Handler context's Done
// channel as a worker of its batcher begins to wait.
var parkedHook atomic.Pointer[func(<-chan struct{})]

// start runs the drain on an idle worker, or on a new one.
func (w *workers) start() {
	w.mu.Lock()
	if w.idle > 0 {
		select {
		case w.wake <- struct{}{}: // room: park keeps idle+len(wake) within its size
			w.idle--
			w.mu.Unlock()
			return
		default:
		}
	}
	w.mu.Unlock()
	go w.run()
}

func (w *workers) run() {
	t := time.NewTimer(time.Duration(idleWorker.Load()))
	defer t.Stop()
	for {
		w.drain()
		if !w.park(t) {
			return
		}
	}
}

// park waits for start to hand this worker a drain (true), or for idleWorker or
// done (false).
func (w *workers) park(t *time.Timer) bool {
	w.mu.Lock()
	if w.idle+len(w.wake) >= batchesInFlight { // tokens not yet taken count as parked
		w.mu.Unlock()
		return false
	}
	w.idle++
	w.mu.Unlock()
	if f := parkedHook.Load(); f != nil {
		(*f)(w.done)
	}
	t.Reset(time.Duration(idleWorker.Load()))
	select {
	case <-w.wake:
		return true
	case <-t.C:
	case <-w.done:
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-w.wake: // start counted on it meanwhile
		return true
	default:
		w.idle--
		return false
	}
}

// Handle runs fn for one message (from Consumer.Messages, Next or a Fetch batch read
// one by one) and acknowledges it. It returns the dedup result and the action taken.
// Give Messages a short idle heartbeat, as Consume (see Handler).
func (j *JetStream) Handle(ctx context.Context, msg jetstream.Msg, fn Func) (dedup.Result, Action) {
	if j == nil {
		noAdapterCtx(ctx, msg)
		return badInput, ActNakWithDelay
	}
	if isNil(msg) {
		j.cfg.logger.Error("dedup: Handle given a nil message; nothing to acknowledge", "handler", j.h.Name())
		return badInput, ActNone
	}
	if fn == nil || ctx == nil {
		return badInput, j.settle(context.Background(), msg, viewJS(msg), badInput, ErrBadInput)
	}
	return j.handle(ctx, msg, func(ctx context.Context, key string, m *Msg) (dedup.Result, error) {
		return runOne(ctx, j.h, key, m.data, func(ctx context.Context) error { return fn(ctx, m) })
	})
}

// handle reads msg's key, runs run for it while msg is kept in progress, and
// acknowledges msg by the result: Handle, and HandleTx.
func (j *JetStream) handle(ctx context.Context, msg jetstream.Msg, run func(ctx context.Context, key string, m *Msg) (dedup.Result, error)) (dedup.Result, Action) {
	m := viewJS(msg)
	key := j.cfg.strategy.Key(m)
	p := j.startProgress(j.cfg.progressEvery, []acker{msg})
	returned := false
	defer func() {
		p.stop()
		if !returned { // fn ended its goroutine (runtime.Goexit): Nak'ed, as after a panic
			j.settle(ctx, msg, m, dedup.Result{Outcome: dedup.Panicked}, errGoexit)
		}
	}()
	res, err := run(ctx, key, m)
	if heldCopy(res) { // the closure only for a copy held
		res, err = j.hold(ctx, msg, m, res, err, func(ctx context.Context) (dedup.Result, error) { return run(ctx, key, m) })
	}
	returned = true
	p.stop()
	return res, j.settle(ctx, msg, m, res, err)
}

// HandleBatch drains a Fetch batch and runs fn for each message, one at a time,
// with one store round trip for the checks. Each message is acknowledged once
// its completion is answered, while the next fn runs, so a crash repeats at most
// the messages whose completion is in flight. It returns batch.Error().
func (j *JetStream) HandleBatch(ctx context.Context, batch jetstream.MessageBatch, fn Func) ([]dedup.ItemResult, error) {
	if j == nil || isNil(batch) {
		return nil, ErrBadInput
	}
	msgs := drain(batch)
	if len(msgs) == 0 {
		return nil, batch.Error()
	}
	if fn == nil || ctx == nil {
		out := make([]dedup.ItemResult, len(msgs))
		for i, msg := range msgs {
			out[i].Err = ErrBadInput
			j.settle(context.Background(), msg, viewJS(msg), badInput, ErrBadInput)
		}
		return out, ErrBadInput
	}
	return j.handleMsgs(ctx, msgs, 1, fn, nil), batch.Error()
}

// drain reads every message of a Fetch batch.
func drain(batch jetstream.MessageBatch) []jetstream.Msg {
	var msgs []jetstream.Msg
	for msg := range batch.Messages() {
		if !isNil(msg) {
			msgs = append(msgs, msg)
		}
	}
	return msgs
}

// handleMsgs handles msgs as one batch through dedup.Handler.Run, up to parallel
// fns at once, and settles them as settleBatch does.
func (j *JetStream) handleMsgs(ctx context.Context, msgs []jetstream.Msg, parallel int, fn Func, settled func(i int)) []dedup.ItemResult {
	return j.settleBatch(ctx, msgs, settled, func(items []dedup.Item, views []*Msg, done func(int, dedup.ItemResult)) []dedup.ItemResult {
		return j.h.Run(ctx, items, func(ctx context.Context, i int) error { return fn(ctx, views[i]) }, dedup.Parallel(max(parallel, 1)), dedup.OnResult(done))
	}, func(ctx context.Context, it dedup.Item, m *Msg) (dedup.Result, error) {
		return runOne(ctx, j.h, it.Key, it.Payload, func(ctx context.Context) error { return fn(ctx, m) })
	})
}

// settleBatch reads the keys of msgs, runs run for them as one batch while they
// are kept in progress, and acknowledges each as soon as run reports its result
// (done), then calls settled(i) if not nil. A held copy (DefaultCopyHold) is
// checked again with one on a goroutine of its own; settleBatch returns once
// every hold has ended. A message left without a result by an fn's
// runtime.Goexit is Nak'ed, as after a panic.
func (j *JetStream) settleBatch(ctx context.Context, msgs []jetstream.Msg, settled func(i int),
	run func(items []dedup.Item, views []*Msg, done func(int, dedup.ItemResult)) []dedup.ItemResult,
	one func(ctx context.Context, it dedup.Item, m *Msg) (dedup.Result, error)) []dedup.ItemResult {
	views := make([]*Msg, len(msgs))
	slab := make([]Msg, len(msgs)) // the views, in one allocation
	items := make([]dedup.Item, len(msgs))
	acks := make([]acker, len(msgs))
	for i, msg := range msgs {
		views[i] = &slab[i]
		setJS(views[i], msg)
		items[i] = dedup.Item{Key: j.cfg.strategy.Key(views[i]), Payload: views[i].data}
		acks[i] = msg
	}
	p := j.startProgress(j.cfg.progressEvery, acks)
	var mu sync.Mutex
	answered := make([]bool, len(msgs))
	var holds sync.WaitGroup
	held := map[int]dedup.ItemResult{} // under mu: the results of held copies
	finish := func(i int, r dedup.Result, err error) {
		mu.Lock()
		if answered[i] {
			mu.Unlock()
			return
		}
		answered[i] = true
		mu.Unlock()
		p.finish(i)
		if heldCopy(r) && one != nil {
			holds.Add(1)
			go func() {
				defer holds.Done()
				r, err := j.hold(ctx, msgs[i], views[i], r, err, func(ctx context.Context) (dedup.Result, error) { return one(ctx, items[i], views[i]) })
				mu.Lock()
				held[i] = dedup.ItemResult{Result: r, Err: err}
				mu.Unlock()
				j.settle(ctx, msgs[i], views[i], r, err)
				if settled != nil {
					settled(i)
				}
			}()
			return
		}
		j.settle(ctx, msgs[i], views[i], r, err)
		if settled != nil {
			settled(i)
		}
	}
	defer func() { // also when an fn ends this goroutine
		p.stop()
		for i := range msgs {
			finish(i, dedup.Result{Outcome: dedup.Panicked}, errGoexit)
		}
	}()
	results := run(items, views, func(i int, r dedup.ItemResult) { finish(i, r.Result, r.Err) })
	holds.Wait()
	for i, r := range held { // every hold has ended
		if i < len(results) {
			results[i] = r
		}
	}
	return results
}

// errGoexit is what a message whose fn ended its goroutine (runtime.Goexit) before
// it had a result is settled with.
var errGoexit = fmt.Errorf("%w: the handler ended its goroutine (runtime.Goexit)", dedup.ErrPanic)
