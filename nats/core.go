package nats

import (
	"context"
	"log/slog"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/dedupkit/dedupkit/dedup"
)

// Core runs one dedup handler on a core NATS subscription, or on a push
// subscription of the older JetStreamContext. A core message has no
// acknowledgement: a duplicate is dropped and a failure only counted, so filter
// mode (dedup.ModeFilter) is the usual choice. A JetStream push delivery is
// acknowledged as by JetStream, but Core cannot read its consumer's config: the
// consumer must use AckExplicitPolicy; give WithMaxDeliver and WithProgressEvery
// (below AckWait), and check the retention with CheckRetention.
type Core struct {
	adapter
}

// NewCore wraps h for core NATS messages. Errors wrap dedup.ErrInvalidOption.
func NewCore(h *dedup.Handler, opts ...Option) (*Core, error) {
	cfg, err := newConfig(h, opts)
	if err != nil {
		return nil, err
	}
	return &Core{adapter{h: h, cfg: cfg}}, nil
}

// Handler returns a nats.MsgHandler for Conn.Subscribe, QueueSubscribe, or a
// JetStreamContext push Subscribe (with ManualAck), running up to WithConcurrency
// messages at once. ctx is the handlers' parent. After unsubscribing, call Wait.
func (c *Core) Handler(ctx context.Context, fn Func) natsgo.MsgHandler {
	if c == nil {
		return func(*natsgo.Msg) {
			slog.Default().Error("dedup: message handed to a nil *Core adapter (did NewCore fail?)")
		}
	}
	dispatch := c.dispatcher()
	if ctx != nil {
		ctx = dedup.WaitForRunning(ctx)
	}
	return func(msg *natsgo.Msg) {
		if msg == nil {
			c.cfg.logger.Error("dedup: nil message handed to the handler; dropped", "handler", c.h.Name())
			return
		}
		dispatch(func() { c.Handle(ctx, msg, fn) })
	}
}

// Handle runs fn for one message and, for a JetStream push delivery, acknowledges it.
func (c *Core) Handle(ctx context.Context, msg *natsgo.Msg, fn Func) (dedup.Result, Action) {
	if c == nil {
		slog.Default().Error("dedup: message handed to a nil *Core adapter (did NewCore fail?)")
		return badInput, ActNone
	}
	if msg == nil {
		c.cfg.logger.Error("dedup: Handle given a nil message; nothing to acknowledge", "handler", c.h.Name())
		return badInput, ActNone
	}
	m := viewCore(msg)
	var ack acker
	if m.Metadata() != nil {
		ack = pushAcker{msg}
	}
	if fn == nil || ctx == nil {
		return badInput, c.settle(context.Background(), ack, m, badInput, ErrBadInput)
	}
	key := c.cfg.strategy.Key(m)
	var acks []acker
	if ack != nil {
		acks = []acker{ack}
	}
	p := c.startProgress(c.cfg.progressEvery, acks)
	returned := false
	defer func() {
		p.stop()
		if !returned { // fn ended its goroutine (runtime.Goexit): Nak'ed, as after a panic
			c.settle(ctx, ack, m, dedup.Result{Outcome: dedup.Panicked}, errGoexit)
		}
	}()
	run := func(ctx context.Context) (dedup.Result, error) {
		return runOne(ctx, c.h, key, m.data, func(ctx context.Context) error { return fn(ctx, m) })
	}
	res, err := run(ctx)
	res, err = c.hold(ctx, ack, m, res, err, run)
	returned = true
	p.stop()
	return res, c.settle(ctx, ack, m, res, err)
}

// pushAcker acknowledges a JetStream push delivery of the older API.
type pushAcker struct{ m *natsgo.Msg }

func (p pushAcker) Ack() error                         { return p.m.Ack() }
func (p pushAcker) DoubleAck(context.Context) error    { return p.m.AckSync() }
func (p pushAcker) Nak() error                         { return p.m.Nak() }
func (p pushAcker) NakWithDelay(d time.Duration) error { return p.m.NakWithDelay(d) }
func (p pushAcker) InProgress() error                  { return p.m.InProgress() }
func (p pushAcker) Term() error                        { return p.m.Term() }
