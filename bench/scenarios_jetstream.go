package main

import (
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup"
	dnats "github.com/dedupkit/dedupkit/nats"
)

// Scenario d: JetStream end to end.
//
// One stream of the run's own holds -js-messages messages, each with its own
// Nats-Msg-Id, published before the first round. In each round every variant reads
// all of them through a durable pull consumer of its own (explicit acks) with
// Consume, and its throughput is the messages over the time from Consume until the
// last one is acked (and the acks flushed to the server with a round trip):
//
//   - raw-ack: the callback only acks;
//   - dedup-filter, dedup-do: the dnats adapter's Handler around an empty fn, on a
//     filter-mode and a Do-mode handler (new handler names each round, so no round
//     sees another's records);
//   - dedup-filter-nolocal: dedup-filter without a local tier (WithLocalCache(0, 0)):
//     what the local tier's lookup and its insert of each first sighting cost on a
//     stream of unique keys, where it answers nothing;
//   - naive-setnx: the callback sends one SetNX of the Nats-Msg-Id and then acks;
//   - handpipelined: what a user writes by hand in thirty lines (issue 22): the
//     callback queues the message, and 4 workers each take up to 64 queued messages,
//     send their SET NX PX in one go-redis pipeline, and ack them.
//
// The stream keeps its messages in memory: file storage would add the disk of a
// shared machine to every variant alike and so hide what dedup costs, which is what
// the ratios are about.

// JetStream variants, in the order of the chart.
var jsVariants = []string{"raw-ack", varFilter, varDo, varNaive, varHandPipelined, varFilterNoLocal}

// The hand-pipelined variant: its workers and the most messages one pipeline carries.
const (
	varHandPipelined = "handpipelined"
	varFilterNoLocal = "dedup-filter-nolocal"
	handWorkers      = 4
	handBatch        = 64
)

// jsState is what scenario d keeps across rounds.
type jsState struct {
	nc            *natsgo.Conn
	js            jetstream.JetStream
	stream        string
	subject       string
	serverVersion string
}

// Consumer settings of every variant. AckWait × MaxDeliver stays well inside the
// records' retention, as dnats.NewJetStream requires.
const (
	jsAckWait       = 30 * time.Second
	jsMaxDeliver    = 5
	jsMaxAckPending = 1000
	// jsPullHeartbeat is every variant's Consume idle heartbeat. nats.go's Consume can
	// stop receiving messages while the server holds no pull request for it (see
	// nats-io/nats.go#1622), until nothing, not even a heartbeat, has arrived for twice
	// the heartbeat: 30 s at the default of 15 s, which would swamp a variant's time;
	// about 2 s at this one.
	jsPullHeartbeat = time.Second
	jsPayload       = `{"order":"0000000000","sku":"bench-sku","qty":1,"note":"dedupkit"}`
)

func (b *bench) setupJetStream(ctx context.Context) error {
	st := &b.js
	var err error
	if st.nc, err = natsgo.Connect(b.srv.natsURL, natsgo.Name("dedupkit-bench")); err != nil {
		return fmt.Errorf("connect to nats at %s: %w", b.srv.natsURL, err)
	}
	b.closers = append(b.closers, func() error { st.nc.Close(); return nil })
	st.serverVersion = st.nc.ConnectedServerVersion()
	if st.js, err = jetstream.New(st.nc, jetstream.WithPublishAsyncMaxPending(4096)); err != nil {
		return err
	}
	st.stream = "DKBENCH_" + strings.ToUpper(b.id)
	st.subject = "dkbench." + b.id
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := st.js.CreateStream(sctx, jetstream.StreamConfig{
		Name:     st.stream,
		Subjects: []string{st.subject},
		Storage:  jetstream.MemoryStorage,
		MaxAge:   time.Hour, // should the deletion at exit not happen
	}); err != nil {
		return fmt.Errorf("create stream: %w", err)
	}
	b.closers = append(b.closers, b.deleteStream)
	return b.publish(ctx)
}

// publish fills the stream with -js-messages messages, ids m-0, m-1, ...
func (b *bench) publish(ctx context.Context) error {
	st := &b.js
	pctx, cancel := context.WithTimeout(ctx, b.cfg.jsTimeout)
	defer cancel()
	if err := publishMsgs(pctx, st.js, st.subject, b.cfg.jsMessages); err != nil {
		return err
	}
	s, err := st.js.Stream(pctx, st.stream)
	if err != nil {
		return err
	}
	if n := s.CachedInfo().State.Msgs; n != uint64(b.cfg.jsMessages) {
		return fmt.Errorf("stream holds %d messages after publishing %d", n, b.cfg.jsMessages)
	}
	return nil
}

// publishMsgs publishes n messages (ids m-0, m-1, ...) on subject and waits for
// every publish ack.
func publishMsgs(ctx context.Context, js jetstream.JetStream, subject string, n int) error {
	for i := range n {
		msg := natsgo.NewMsg(subject)
		msg.Header.Set(jetstream.MsgIDHeader, "m-"+strconv.Itoa(i))
		msg.Data = []byte(jsPayload)
		if _, err := js.PublishMsgAsync(msg); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("publish: %d acks outstanding: %w", js.PublishAsyncPending(), ctx.Err())
	}
}

func (b *bench) deleteStream() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.js.js.DeleteStream(ctx, b.js.stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("delete stream %s: %w", b.js.stream, err)
	}
	return nil
}

func (b *bench) roundJetStream(ctx context.Context, r int) error {
	for j := range jsVariants {
		v := jsVariants[(j+r)%len(jsVariants)]
		var m metrics
		var err error
		// The label marks the variant's samples in -cpuprofile (pprof -tagfocus
		// variant=dedup-filter) on goroutines started meanwhile; nats.go's own
		// (its reader and its message dispatch) started earlier and carry none.
		pprof.Do(ctx, pprof.Labels("scenario", "jetstream", "variant", v), func(ctx context.Context) {
			m, err = b.consumeAll(ctx, r, v)
		})
		if err != nil {
			return fmt.Errorf("%s: %w", v, err)
		}
		if err := b.record(ctx, "jetstream", v, 0, r, m); err != nil {
			return err
		}
	}
	return nil
}

// tally counts what the variant did to deliveries; done closes at the want-th ack.
type tally struct {
	want   int64
	acks   atomic.Int64
	others atomic.Int64 // Nak, NakWithDelay, Term: deliveries not acked
	once   sync.Once
	done   chan struct{}
}

// countedMsg counts a delivery's acknowledgements: acks are asynchronous, so the
// variant is done when its last ack has been sent, whoever sends it.
type countedMsg struct {
	jetstream.Msg
	t *tally
}

func (m countedMsg) Ack() error {
	err := m.Msg.Ack()
	if m.t.acks.Add(1) == m.t.want {
		m.t.once.Do(func() { close(m.t.done) })
	}
	return err
}

func (m countedMsg) DoubleAck(ctx context.Context) error {
	err := m.Msg.DoubleAck(ctx)
	if m.t.acks.Add(1) == m.t.want {
		m.t.once.Do(func() { close(m.t.done) })
	}
	return err
}

func (m countedMsg) Nak() error { m.t.others.Add(1); return m.Msg.Nak() }

func (m countedMsg) NakWithDelay(d time.Duration) error {
	m.t.others.Add(1)
	return m.Msg.NakWithDelay(d)
}

func (m countedMsg) Term() error { m.t.others.Add(1); return m.Msg.Term() }

// consumeAll reads the whole stream with variant v on a new consumer and returns
// messages per second, and the CPU this process and Redis spent per message.
func (b *bench) consumeAll(ctx context.Context, r int, v string) (metrics, error) {
	st := &b.js
	durable := fmt.Sprintf("%s-r%d", v, r)
	cctx, cancel := context.WithTimeout(ctx, b.cfg.jsTimeout)
	defer cancel()
	cons, err := st.js.CreateConsumer(cctx, st.stream, jetstream.ConsumerConfig{
		Durable:       durable,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       jsAckWait,
		MaxDeliver:    jsMaxDeliver,
		MaxAckPending: jsMaxAckPending,
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer: %w", err)
	}
	defer func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer dcancel()
		_ = st.js.DeleteConsumer(dctx, st.stream, durable) // the stream's deletion would do it too
	}()
	handle, wait, err := b.jsHandler(cctx, r, v, cons)
	if err != nil {
		return nil, err
	}
	t := &tally{want: int64(b.cfg.jsMessages), done: make(chan struct{})}
	var consumeErrs atomic.Int64
	var firstErr atomic.Value
	meter := b.startCPU(ctx)
	start := time.Now()
	cc, err := cons.Consume(func(msg jetstream.Msg) { handle(countedMsg{msg, t}) },
		jetstream.PullHeartbeat(jsPullHeartbeat),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if consumeErrs.Add(1) == 1 {
				firstErr.Store(err.Error())
			}
		}))
	if err != nil {
		return nil, fmt.Errorf("consume: %w", err)
	}
	select {
	case <-t.done:
	case <-cctx.Done():
	}
	ferr := st.nc.FlushWithContext(cctx) // the last acks reach the server
	elapsed := time.Since(start)
	use := meter.stop(ctx)
	cc.Stop()
	select {
	case <-cc.Closed():
	case <-time.After(5 * time.Second):
	}
	wait() // the adapter's messages in hand
	if n := consumeErrs.Load(); n > 0 {
		b.note("JetStream %s, round %d: %d Consume errors (first: %v)", v, r+1, n, firstErr.Load())
	}
	if err := cctx.Err(); err != nil {
		return nil, fmt.Errorf("%d of %d messages acked (%d not acked) before giving up: %w", t.acks.Load(), t.want, t.others.Load(), err)
	}
	if ferr != nil {
		return nil, fmt.Errorf("flush: %w", ferr)
	}
	if n := t.others.Load(); n > 0 {
		return nil, fmt.Errorf("%d deliveries were not acked", n)
	}
	if err := settled(cctx, cons); err != nil {
		return nil, err
	}
	m := metrics{mOps: float64(t.want) / elapsed.Seconds()}
	use.addTo(m)
	return m, nil
}

// jsHandler returns variant v's Consume callback, and what waits for the messages it
// still has in hand once Consume has stopped.
func (b *bench) jsHandler(ctx context.Context, r int, v string, cons jetstream.Consumer) (func(jetstream.Msg), func(), error) {
	none := func() {}
	switch v {
	case varFilter, varDo, varFilterNoLocal:
		opts := []dedup.HandlerOption{dedup.WithMode(dedup.ModeFilter), dedup.WithRetention(retention)}
		switch v {
		case varDo:
			opts[0] = dedup.WithMode(dedup.ModeDo)
		case varFilterNoLocal:
			opts = append(opts, dedup.WithLocalCache(0, 0))
		}
		h, err := b.dd.Register(fmt.Sprintf("js-%s-r%d", v, r), opts...)
		if err != nil {
			return nil, nil, err
		}
		a, err := dnats.NewJetStream(h, cons, dnats.WithConcurrency(b.cfg.jsConcurrency))
		if err != nil {
			return nil, nil, err
		}
		return a.Handler(ctx, func(context.Context, *dnats.Msg) error { return nil }), a.Wait, nil
	case varHandPipelined:
		return b.handPipelined(ctx, fmt.Sprintf("%s:jshand-r%d:", b.prefix, r))
	case varNaive:
		head := fmt.Sprintf("%s:jsnaive-r%d:", b.prefix, r)
		return func(msg jetstream.Msg) {
			id := msg.Headers().Get(jetstream.MsgIDHeader)
			if _, err := b.plainRDB.SetNX(ctx, head+id, 1, retention).Result(); err != nil {
				_ = msg.Nak()
				return
			}
			_ = msg.Ack() // first sighting or not, the (empty) work is done
		}, none, nil
	default:
		return func(msg jetstream.Msg) { _ = msg.Ack() }, none, nil
	}
}

// settled waits until the server has every ack of cons: nothing pending, nothing
// waiting for an ack.
func settled(ctx context.Context, cons jetstream.Consumer) error {
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			return fmt.Errorf("consumer info: %w", err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("server still has %d pending and %d unacked: %w", info.NumPending, info.NumAckPending, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// handPipelined is the hand-pipelined variant's callback: messages queue, and each
// of handWorkers workers takes what has queued (up to handBatch), sends one pipeline
// of SET NX PX (the Nats-Msg-Id under head), and acks each (a first sighting or not,
// the empty work is done; a failed pipeline Naks them). wait stops the workers once
// Consume has stopped.
func (b *bench) handPipelined(ctx context.Context, head string) (func(jetstream.Msg), func(), error) {
	queue := make(chan jetstream.Msg, jsMaxAckPending)
	var wg sync.WaitGroup
	for range handWorkers {
		wg.Go(func() {
			batch := make([]jetstream.Msg, 0, handBatch)
			cmds := make([]*redis.BoolCmd, 0, handBatch)
			for msg := range queue {
				batch = append(batch[:0], msg)
			fill:
				for len(batch) < handBatch {
					select {
					case m, ok := <-queue:
						if !ok {
							break fill
						}
						batch = append(batch, m)
					default:
						break fill
					}
				}
				cmds = cmds[:0]
				_, err := b.plainRDB.Pipelined(ctx, func(p redis.Pipeliner) error {
					for _, m := range batch {
						cmds = append(cmds, p.SetNX(ctx, head+m.Headers().Get(jetstream.MsgIDHeader), 1, retention))
					}
					return nil
				})
				for _, m := range batch {
					if err != nil {
						_ = m.Nak()
						continue
					}
					_ = m.Ack()
				}
			}
		})
	}
	var once sync.Once
	stop := func() { once.Do(func() { close(queue) }); wg.Wait() }
	return func(msg jetstream.Msg) { queue <- msg }, stop, nil
}
