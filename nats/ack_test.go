package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/internal/storekit"
	"github.com/dedupkit/dedupkit/internal/testenv"
	"github.com/dedupkit/dedupkit/keys"
)

// The outcome → ack table at unit level, with fake messages: the exact action, delay
// and hook call for every outcome, without a server.

// fakeMsg is a jetstream.Msg that records what is done to it.
type fakeMsg struct {
	meta     *jetstream.MsgMetadata
	hdr      natsgo.Header
	data     []byte
	mu       sync.Mutex
	acks     []string // "ack", "double-ack", "nak", "nak-with-delay <d>", "term", "term-with-reason <r>"
	progress atomic.Int64
	parsed   atomic.Int64 // Metadata calls
}

var _ jetstream.Msg = (*fakeMsg)(nil)

// newFake is a delivery of stream S, stream sequence 7, with the given Nats-Msg-Id
// ("" for none).
func newFake(id, data string, delivered uint64) *fakeMsg {
	m := &fakeMsg{
		meta: &jetstream.MsgMetadata{Stream: "S", Consumer: "c", NumDelivered: delivered,
			Sequence: jetstream.SequencePair{Stream: 7, Consumer: delivered}},
		hdr:  natsgo.Header{},
		data: []byte(data),
	}
	if id != "" {
		m.hdr.Set(jetstream.MsgIDHeader, id)
	}
	return m
}

func (m *fakeMsg) record(s string) error {
	m.mu.Lock()
	m.acks = append(m.acks, s)
	m.mu.Unlock()
	return nil
}

func (m *fakeMsg) got() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.acks...)
}

func (m *fakeMsg) Metadata() (*jetstream.MsgMetadata, error) {
	m.parsed.Add(1)
	if m.meta == nil {
		return nil, jetstream.ErrNotJSMessage
	}
	return m.meta, nil
}
func (m *fakeMsg) Data() []byte                    { return m.data }
func (m *fakeMsg) Headers() natsgo.Header          { return m.hdr }
func (m *fakeMsg) Subject() string                 { return "orders.new" }
func (m *fakeMsg) Reply() string                   { return "$JS.ACK.fake" }
func (m *fakeMsg) Ack() error                      { return m.record("ack") }
func (m *fakeMsg) DoubleAck(context.Context) error { return m.record("double-ack") }
func (m *fakeMsg) Nak() error                      { return m.record("nak") }
func (m *fakeMsg) NakWithDelay(d time.Duration) error {
	return m.record(fmt.Sprint("nak-with-delay ", d))
}
func (m *fakeMsg) InProgress() error             { m.progress.Add(1); return nil }
func (m *fakeMsg) Term() error                   { return m.record("term") }
func (m *fakeMsg) TermWithReason(r string) error { return m.record("term-with-reason " + r) }

// fakeConsumer is a jetstream.Consumer with only its cached info.
type fakeConsumer struct {
	jetstream.Consumer
	info *jetstream.ConsumerInfo
}

func (c fakeConsumer) CachedInfo() *jetstream.ConsumerInfo { return c.info }

func consumerWith(ackWait time.Duration, maxDeliver int, backoff ...time.Duration) fakeConsumer {
	return fakeConsumer{info: &jetstream.ConsumerInfo{Name: "c", Config: jetstream.ConsumerConfig{
		Durable: "c", AckWait: ackWait, MaxDeliver: maxDeliver, BackOff: backoff,
	}}}
}

func TestEachOutcomeGetsItsAckAction(t *testing.T) {
	boom := errors.New("boom")
	failing := func(context.Context, *Msg) error { return boom }
	type exhaustedCall struct {
		delivered uint64
		err       error
	}
	type tc struct {
		name      string
		hopts     []dedup.HandlerOption
		opts      []Option
		setup     func(t *testing.T, s *flakyStore, h *dedup.Handler) // before the delivery
		msg       *fakeMsg
		fn        func(ctx context.Context, m *Msg) error
		ctx       func() (context.Context, context.CancelFunc)
		outcome   dedup.Outcome
		unguarded bool
		act       Action
		acks      string // what the message saw; "nak-with-delay ~<d>" means in (d - 1s, d]
		runs      int
		exhausted []exhaustedCall
		logged    string
		held      bool // a copy held while another owner ran its key
	}
	markDone := func(fp string) func(*testing.T, *flakyStore, *dedup.Handler) {
		return func(t *testing.T, s *flakyStore, h *dedup.Handler) {
			if _, err := storekit.Only(s.Mark(context.Background(), oneEntry(h.RecordKey("order-1"), "other", fp, time.Hour))); err != nil {
				t.Fatal(err)
			}
		}
	}
	claimedBy := func(owner string, lease time.Duration) func(*testing.T, *flakyStore, *dedup.Handler) {
		return func(t *testing.T, s *flakyStore, h *dedup.Handler) {
			if _, err := storekit.Only(s.Claim(context.Background(), oneEntry(h.RecordKey("order-1"), owner, "", lease))); err != nil {
				t.Fatal(err)
			}
		}
	}
	cases := []tc{
		{name: "processed", msg: newFake("order-1", "a", 1), outcome: dedup.Processed, act: ActAck, acks: "ack", runs: 1},
		{name: "processed, double ack", opts: []Option{WithDoubleAck(true)}, msg: newFake("order-1", "a", 1),
			outcome: dedup.Processed, act: ActDoubleAck, acks: "double-ack", runs: 1},
		{name: "duplicate", setup: markDone(""), msg: newFake("order-1", "a", 1), outcome: dedup.Duplicate, act: ActAck, acks: "ack"},
		{name: "in progress elsewhere, a run longer than the hold", msg: newFake("order-1", "a", 1),
			setup:   claimedBy("other", 5*time.Second),
			outcome: dedup.InProgress, act: ActNakWithDelay, acks: "nak-with-delay 1s", held: true},
		{name: "in progress elsewhere, a run longer than the hold, later delivery", msg: newFake("order-1", "a", 3),
			setup:   claimedBy("other", 5*time.Second), // 3 s left after the hold: the backoff's 4 s is capped
			outcome: dedup.InProgress, act: ActNakWithDelay, acks: "nak-with-delay ~3s", held: true},
		{name: "in progress elsewhere, shutdown during the hold", msg: newFake("order-1", "a", 1),
			setup: claimedBy("other", 5*time.Second),
			// it ends between the checks at 350 and 750 ms: the hold is cut short, and counted
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 550*time.Millisecond)
			},
			outcome: dedup.InProgress, act: ActNakWithDelay, acks: "nak-with-delay 1s", held: true},
		{name: "in progress elsewhere, the run ends during the hold", msg: newFake("order-1", "a", 1),
			setup: func(t *testing.T, s *flakyStore, h *dedup.Handler) {
				claimedBy("other", 5*time.Second)(t, s, h)
				time.AfterFunc(150*time.Millisecond, func() {
					_, _ = s.Complete(context.Background(), oneEntry(h.RecordKey("order-1"), "other", "", time.Hour))
				})
			},
			outcome: dedup.Duplicate, act: ActAck, acks: "ack", held: true},
		{name: "in progress elsewhere, the owner gives the key back during the hold", msg: newFake("order-1", "a", 1),
			setup: func(t *testing.T, s *flakyStore, h *dedup.Handler) {
				claimedBy("other", 5*time.Second)(t, s, h)
				time.AfterFunc(150*time.Millisecond, func() { _, _ = s.Release(context.Background(), oneEntry(h.RecordKey("order-1"), "other", "", 0)) })
			},
			outcome: dedup.Processed, act: ActAck, acks: "ack", runs: 1, held: true},
		{name: "handler error", opts: []Option{WithBackoff(func(n uint64) time.Duration { return time.Duration(n) * 123 * time.Millisecond })},
			msg: newFake("order-1", "a", 2), fn: failing, outcome: dedup.Failed, act: ActNakWithDelay, acks: "nak-with-delay 246ms", runs: 1},
		{name: "handler error, backoff below the minimum", opts: []Option{WithBackoff(func(uint64) time.Duration { return time.Millisecond })},
			msg: newFake("order-1", "a", 1), fn: failing, outcome: dedup.Failed, act: ActNakWithDelay, acks: "nak-with-delay " + DefaultMinDelay.String(), runs: 1},
		{name: "handler error, default backoff", msg: newFake("order-1", "a", 3), fn: failing,
			outcome: dedup.Failed, act: ActNakWithDelay, acks: "nak-with-delay 4s", runs: 1},
		{name: "handler error, last delivery", msg: newFake("order-1", "a", 5), fn: failing,
			outcome: dedup.Failed, act: ActTerm, acks: "term", runs: 1, exhausted: []exhaustedCall{{5, boom}}},
		{name: "handler error, past the last delivery", msg: newFake("order-1", "a", 6), fn: failing,
			outcome: dedup.Failed, act: ActTerm, acks: "term", runs: 1, exhausted: []exhaustedCall{{6, boom}}},
		{name: "panic", msg: newFake("order-1", "a", 1), fn: func(context.Context, *Msg) error { panic("oops") },
			outcome: dedup.Panicked, act: ActNak, acks: "nak", runs: 1},
		{name: "panic, last delivery", msg: newFake("order-1", "a", 5), fn: func(context.Context, *Msg) error { panic("oops") },
			outcome: dedup.Panicked, act: ActTerm, acks: "term", runs: 1, exhausted: []exhaustedCall{{5, dedup.ErrPanic}}},
		{name: "no key", opts: []Option{WithKeyStrategy(keys.Header("Order-Id"))}, msg: newFake("order-1", "a", 1),
			outcome: dedup.NoKey, act: ActTerm, acks: "term", logged: ReasonNoKey},
		{name: "no key, processed", hopts: []dedup.HandlerOption{dedup.WithMissingKey(dedup.ProcessMissingKey)},
			opts: []Option{WithKeyStrategy(keys.Header("Order-Id"))}, msg: newFake("order-1", "a", 1),
			outcome: dedup.Processed, unguarded: true, act: ActAck, acks: "ack", runs: 1},
		{name: "key reuse", hopts: []dedup.HandlerOption{dedup.WithFingerprint(true)}, setup: markDone(dedup.Fingerprint([]byte("a"))),
			msg: newFake("order-1", "b", 1), outcome: dedup.KeyReuse, act: ActTerm, acks: "term", logged: ReasonKeyReuse},
		{name: "same key, same payload", hopts: []dedup.HandlerOption{dedup.WithFingerprint(true)}, setup: markDone(dedup.Fingerprint([]byte("a"))),
			msg: newFake("order-1", "a", 1), outcome: dedup.Duplicate, act: ActAck, acks: "ack"},
		{name: "store down, fail closed", opts: []Option{WithStoreRetryDelay(321 * time.Millisecond)},
			setup:   func(_ *testing.T, s *flakyStore, _ *dedup.Handler) { s.down(true) },
			msg:     newFake("order-1", "a", 1),
			outcome: dedup.StoreUnavailable, act: ActNakWithDelay, acks: "nak-with-delay 321ms"},
		{name: "store down, last delivery",
			setup:   func(_ *testing.T, s *flakyStore, _ *dedup.Handler) { s.down(true) },
			msg:     newFake("order-1", "a", 5),
			outcome: dedup.StoreUnavailable, act: ActTerm, acks: "term", exhausted: []exhaustedCall{{5, dedup.ErrStoreUnavailable}}},
		{name: "in progress elsewhere, last delivery: held until the dead owner's lease ends, then run", msg: newFake("order-1", "a", 5),
			setup:   claimedBy("other", 2500*time.Millisecond), // past the 2 s hold
			outcome: dedup.Processed, act: ActAck, acks: "ack", runs: 1, held: true},
		{name: "in progress elsewhere, last delivery, the owner still running after its lease", msg: newFake("order-1", "a", 5),
			setup: func(t *testing.T, s *flakyStore, h *dedup.Handler) {
				claimedBy("other", 300*time.Millisecond)(t, s, h)
				stop := make(chan struct{})
				t.Cleanup(func() { close(stop) })
				go func() { // the owner's heartbeat
					for {
						select {
						case <-stop:
							return
						case <-time.After(50 * time.Millisecond):
							_, _ = s.Extend(context.Background(), oneEntry(h.RecordKey("order-1"), "other", "", 300*time.Millisecond))
						}
					}
				}()
			},
			outcome: dedup.InProgress, act: ActTerm, acks: "term", exhausted: []exhaustedCall{{5, ErrNoDeliveryLeft}}, held: true},
		{name: "shutdown, last delivery", msg: newFake("order-1", "a", 5),
			ctx:     func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
			outcome: dedup.Cancelled, act: ActTerm, acks: "term", runs: 1, exhausted: []exhaustedCall{{5, context.Canceled}}},
		{name: "store down, fail closed, default delay",
			setup:   func(_ *testing.T, s *flakyStore, _ *dedup.Handler) { s.down(true) },
			msg:     newFake("order-1", "a", 1),
			outcome: dedup.StoreUnavailable, act: ActNakWithDelay, acks: "nak-with-delay 1s"},
		{name: "store down, fail open", hopts: []dedup.HandlerOption{dedup.WithStoreFailure(dedup.FailOpen)},
			setup:   func(_ *testing.T, s *flakyStore, _ *dedup.Handler) { s.down(true) },
			msg:     newFake("order-1", "a", 1),
			outcome: dedup.Processed, unguarded: true, act: ActAck, acks: "ack", runs: 1},
		{name: "done but not recorded",
			setup: func(_ *testing.T, s *flakyStore, _ *dedup.Handler) {
				s.onFail(func(op string) error {
					if op == "complete" {
						return fmt.Errorf("%w: injected", dedup.ErrStoreUnavailable)
					}
					return nil
				})
			},
			msg: newFake("order-1", "a", 1), outcome: dedup.NotRecorded, act: ActAck, acks: "ack", runs: 1},
		{name: "lease lost", hopts: []dedup.HandlerOption{dedup.WithLease(30 * time.Millisecond)},
			setup: func(_ *testing.T, s *flakyStore, _ *dedup.Handler) {
				s.onFail(func(op string) error {
					if op == "extend" {
						return dedup.ErrLeaseLost
					}
					return nil
				})
			},
			msg:     newFake("order-1", "a", 1),
			fn:      func(ctx context.Context, _ *Msg) error { <-ctx.Done(); return ctx.Err() },
			outcome: dedup.LeaseLost, act: ActNone, runs: 1},
		{name: "shutdown", msg: newFake("order-1", "a", 1),
			ctx:     func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
			outcome: dedup.Cancelled, act: ActNone, runs: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			store := &flakyStore{Store: memStore(t)}
			h := register(t, newDeduper(t, store), "orders", c.hopts...)
			var calls []exhaustedCall
			logs := &testenv.LogBuffer{}
			opts := append([]Option{
				WithLogger(slog.New(slog.NewTextHandler(logs, nil))),
				WithExhausted(func(_ context.Context, m *Msg, err error) {
					calls = append(calls, exhaustedCall{m.NumDelivered(), err})
				}),
			}, c.opts...)
			j, err := NewJetStream(h, consumerWith(time.Second, 5), opts...)
			if err != nil {
				t.Fatal(err)
			}
			if c.setup != nil {
				c.setup(t, store, h)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if c.ctx != nil {
				ctx, cancel = c.ctx()
				defer cancel()
			}
			ran := 0
			fn := c.fn
			if fn == nil {
				fn = func(context.Context, *Msg) error { return nil }
			}
			res, act := j.Handle(ctx, c.msg, func(fctx context.Context, m *Msg) error {
				ran++
				if c.outcome == dedup.Cancelled {
					cancel() // shutdown while the handler runs
					<-fctx.Done()
					return fctx.Err()
				}
				return fn(fctx, m)
			})
			if res.Outcome != c.outcome || res.Unguarded != c.unguarded || act != c.act || ran != c.runs {
				t.Fatalf("got %v (unguarded %v), %v, %d runs; want %v (unguarded %v), %v, %d runs",
					res.Outcome, res.Unguarded, act, ran, c.outcome, c.unguarded, c.act, c.runs)
			}
			acks := c.msg.got()
			switch {
			case c.acks == "":
				if len(acks) != 0 {
					t.Fatalf("message got %q, want no acknowledgement", acks)
				}
			case strings.HasPrefix(c.acks, "nak-with-delay ~"):
				top, _ := time.ParseDuration(strings.TrimPrefix(c.acks, "nak-with-delay ~"))
				var d time.Duration
				if len(acks) != 1 || !strings.HasPrefix(acks[0], "nak-with-delay ") {
					t.Fatalf("message got %q, want %s", acks, c.acks)
				}
				d, _ = time.ParseDuration(strings.TrimPrefix(acks[0], "nak-with-delay "))
				if d > top || d <= top-time.Second {
					t.Fatalf("nak delay %v, want what is left of the other owner's %v lease", d, top)
				}
			default:
				if len(acks) != 1 || acks[0] != c.acks {
					t.Fatalf("message got %q, want [%s]", acks, c.acks)
				}
			}
			if len(calls) != len(c.exhausted) {
				t.Fatalf("exhausted hook called %d times, want %d", len(calls), len(c.exhausted))
			}
			for i, w := range c.exhausted {
				if calls[i].delivered != w.delivered || !errors.Is(calls[i].err, w.err) {
					t.Fatalf("exhausted hook got (%d, %v), want (%d, %v)", calls[i].delivered, calls[i].err, w.delivered, w.err)
				}
			}
			switch c.outcome {
			case dedup.Failed, dedup.Panicked, dedup.Cancelled, dedup.LeaseLost:
				store.down(false)
				if a, err := storekit.Only(store.Claim(context.Background(), oneEntry(h.RecordKey("order-1"), "probe", "", time.Second))); err != nil || a.Status != driver.StatusAcquired {
					t.Fatalf("claim not released: a probe claim got %v %v", a.Status, err)
				}
			}
			s := j.Stats()
			if s.Count(c.act) != 1 || s.AckErrors != 0 || s.Exhausted != uint64(len(c.exhausted)) {
				t.Fatalf("stats: %d × %v, %d ack errors, %d exhausted", s.Count(c.act), c.act, s.AckErrors, s.Exhausted)
			}
			if held := s.Held == 1; held != c.held || (c.held && c.msg.progress.Load() == 0) {
				t.Fatalf("held %d copies (want held: %v), %d in-progress signals", s.Held, c.held, c.msg.progress.Load())
			}
			if c.logged != "" {
				out := logs.String()
				if !strings.Contains(out, c.logged) || !strings.Contains(out, "stream_seq=7") || strings.Contains(out, "order-1") {
					t.Fatalf("log %q: want the reason %q and the sequence, never the key", out, c.logged)
				}
			}
		})
	}
}

// Without a hook, an exhausted message is logged (by sequence, never by key) and
// terminated.
func TestExhaustedWithoutHookIsLogged(t *testing.T) {
	h := register(t, newDeduper(t, memStore(t)), "orders")
	logs := &testenv.LogBuffer{}
	j, err := NewJetStream(h, consumerWith(time.Second, 2), WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	m := newFake("order-1", "secret payload", 2)
	_, act := j.Handle(context.Background(), m, func(context.Context, *Msg) error { return errors.New("boom") })
	if act != ActTerm || j.Stats().Exhausted != 1 {
		t.Fatalf("action %v, exhausted %d", act, j.Stats().Exhausted)
	}
	out := logs.String()
	if !strings.Contains(out, "last delivery") || !strings.Contains(out, "outcome=failed") || !strings.Contains(out, "stream_seq=7") || strings.Contains(out, "order-1") || strings.Contains(out, "secret") {
		t.Fatalf("log %q", out)
	}
	// A run cut short by its context, as at shutdown, is logged as that, not as a
	// handler that failed.
	before := len(logs.String())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if res, act := j.Handle(ctx, newFake("order-2", "secret payload", 2), func(context.Context, *Msg) error { return nil }); res.Outcome != dedup.Cancelled || act != ActTerm {
		t.Fatalf("cancelled on the last delivery: %v, %v", res.Outcome, act)
	}
	if out := logs.String()[before:]; !strings.Contains(out, "outcome=cancelled") || strings.Contains(out, "failed") || strings.Contains(out, "order-2") {
		t.Fatalf("log %q", out)
	}
}

// While a handler runs, the message is marked in progress every interval; after the
// ack, never again.
func TestMessageIsMarkedInProgressWhileItsHandlerRuns(t *testing.T) {
	h := register(t, newDeduper(t, memStore(t)), "orders")
	j := newJS(t, h, consumerWith(time.Second, 5), WithProgressEvery(5*time.Millisecond))
	m := newFake("order-1", "a", 1)
	res, act := j.Handle(context.Background(), m, func(ctx context.Context, _ *Msg) error {
		deadline := time.Now().Add(10 * time.Second)
		for m.progress.Load() < 3 {
			if time.Now().After(deadline) {
				return errors.New("no in-progress signals")
			}
			time.Sleep(time.Millisecond)
		}
		return nil
	})
	if res.Outcome != dedup.Processed || act != ActAck {
		t.Fatalf("%v %v", res.Outcome, act)
	}
	after := m.progress.Load()
	if s := j.Stats(); s.InProgress < 3 || s.InProgress != uint64(after) {
		t.Fatalf("stats count %d in-progress signals, the message saw %d", s.InProgress, after)
	}
	consistently(t, 50*time.Millisecond, func() string {
		if n := m.progress.Load(); n != after {
			return fmt.Sprintf("in-progress sent after the ack (%d, then %d)", after, n)
		}
		return ""
	})
}

// The default progress interval is AckWait/3, from the consumer.
func TestProgressEveryDefaultsToAckWaitThird(t *testing.T) {
	h := register(t, newDeduper(t, memStore(t)), "orders")
	j := newJS(t, h, consumerWith(90*time.Millisecond, 5))
	if j.cfg.progressEvery != 30*time.Millisecond {
		t.Fatalf("progress every %v, want 30ms", j.cfg.progressEvery)
	}
	j = newJS(t, h, consumerWith(0, 5)) // server default AckWait
	if j.cfg.progressEvery != 10*time.Second {
		t.Fatalf("progress every %v, want 10s", j.cfg.progressEvery)
	}
	j = newJS(t, h, consumerWith(90*time.Millisecond, 5), WithProgressEvery(time.Millisecond))
	if j.cfg.progressEvery != time.Millisecond {
		t.Fatalf("progress every %v, want the option's 1ms", j.cfg.progressEvery)
	}
}

// fakeBatch is a jetstream.MessageBatch of fake messages.
type fakeBatch struct {
	ch  chan jetstream.Msg
	err error
}

func newBatch(err error, msgs ...*fakeMsg) fakeBatch {
	b := fakeBatch{ch: make(chan jetstream.Msg, len(msgs)), err: err}
	for _, m := range msgs {
		b.ch <- m
	}
	close(b.ch)
	return b
}

func (b fakeBatch) Messages() <-chan jetstream.Msg { return b.ch }
func (b fakeBatch) Error() error                   { return b.err }

// Every message of a batch is acknowledged by its own outcome.
func TestEachBatchMessageIsAcknowledgedByItsOwnOutcome(t *testing.T) {
	store := memStore(t)
	h := register(t, newDeduper(t, store), "orders")
	j := newJS(t, h, consumerWith(time.Second, 5), WithKeyStrategy(keys.Header("Order-Id")),
		WithBackoff(func(uint64) time.Duration { return 200 * time.Millisecond }))
	if _, err := storekit.Only(store.Mark(context.Background(), oneEntry(h.RecordKey("done"), "other", "", time.Hour))); err != nil {
		t.Fatal(err)
	}
	msg := func(orderID, data string) *fakeMsg {
		m := newFake("", data, 1)
		if orderID != "" {
			m.hdr.Set("Order-Id", orderID)
		}
		return m
	}
	msgs := []*fakeMsg{msg("a", "ok"), msg("done", "ok"), msg("b", "fail"), msg("", "ok"), msg("a", "ok")}
	batchErr := errors.New("batch ended early")
	results, err := j.HandleBatch(context.Background(), newBatch(batchErr, msgs...), func(_ context.Context, m *Msg) error {
		if string(m.Data()) == "fail" {
			return errors.New("boom")
		}
		return nil
	})
	if !errors.Is(err, batchErr) {
		t.Fatalf("batch error %v, want the batch's own", err)
	}
	want := []struct {
		o   dedup.Outcome
		ack string
	}{
		{dedup.Processed, "ack"}, {dedup.Duplicate, "ack"}, {dedup.Failed, "nak-with-delay 200ms"},
		{dedup.NoKey, "term"}, {dedup.Duplicate, "ack"},
	}
	for i, w := range want {
		if results[i].Outcome != w.o {
			t.Fatalf("item %d: %v, want %v", i, results[i].Outcome, w.o)
		}
		if got := msgs[i].got(); len(got) != 1 || got[0] != w.ack {
			t.Fatalf("item %d got %q, want [%s]", i, got, w.ack)
		}
	}
	if res, err := j.HandleBatch(context.Background(), newBatch(nil), nil); res != nil || err != nil {
		t.Fatalf("empty batch: %v %v", res, err)
	}
}

// In a batch, a message that has its result (and its ack) is no longer marked in
// progress while the batch's other messages still run.
func TestBatchProgressSkipsSettledMessages(t *testing.T) {
	h := register(t, newDeduper(t, memStore(t)), "orders", dedup.WithMode(dedup.ModeFilter))
	j := newJS(t, h, consumerWith(time.Second, 5), WithProgressEvery(5*time.Millisecond))
	fast, slow := newFake("order-1", "a", 1), newFake("order-2", "b", 1)
	var atStart, atEnd int64
	res := j.handleMsgs(context.Background(), []jetstream.Msg{fast, slow}, 1, func(ctx context.Context, m *Msg) error {
		if m.Header(jetstream.MsgIDHeader) != "order-2" {
			return nil
		}
		atStart = fast.progress.Load() // fast is acked: its result came first
		deadline := time.Now().Add(10 * time.Second)
		for slow.progress.Load() < 3 {
			if time.Now().After(deadline) {
				return errors.New("no in-progress signals")
			}
			time.Sleep(time.Millisecond)
		}
		atEnd = fast.progress.Load()
		return nil
	}, nil)
	for i, r := range res {
		if r.Outcome != dedup.Processed || r.Err != nil {
			t.Fatalf("message %d: %v %v", i, r.Outcome, r.Err)
		}
	}
	if acks := fast.got(); len(acks) != 1 || acks[0] != "ack" {
		t.Fatalf("fast message: %v, want one ack", acks)
	}
	if atEnd != atStart {
		t.Fatalf("the settled message was marked in progress %d times more while the other ran", atEnd-atStart)
	}
}

// A JetStream delivery's metadata (parsed from its reply subject on each
// jetstream.Msg.Metadata call) is read only when something needs it, and once: a
// message handled and acked by its Nats-Msg-Id needs none, a failed one reads it once
// for its backoff however often it is asked, and the fn sees the same values.
func TestMetadataIsReadOnlyWhenNeededAndOnce(t *testing.T) {
	h := register(t, newDeduper(t, memStore(t)), "orders")
	j := newJS(t, h, consumerWith(time.Second, 5), WithBackoff(func(n uint64) time.Duration { return time.Duration(n) * time.Second }))
	ok := newFake("order-1", "a", 1)
	if _, act := j.Handle(context.Background(), ok, func(context.Context, *Msg) error { return nil }); act != ActAck {
		t.Fatalf("action %v, want ack", act)
	}
	if n := ok.parsed.Load(); n != 0 {
		t.Errorf("metadata read %d times for a message acked by its Nats-Msg-Id, want 0", n)
	}

	failed := newFake("order-2", "b", 3)
	var seen uint64
	_, act := j.Handle(context.Background(), failed, func(_ context.Context, m *Msg) error {
		seen = m.NumDelivered() + m.Metadata().Sequence.Stream
		return errors.New("boom")
	})
	if act != ActNakWithDelay || seen != 3+7 {
		t.Fatalf("action %v, fn saw delivered + sequence %d; want a delayed nak and 10", act, seen)
	}
	if got := failed.got(); len(got) != 1 || got[0] != "nak-with-delay 3s" {
		t.Errorf("acks %v, want a nak with the backoff of the third delivery", got)
	}
	if n := failed.parsed.Load(); n != 1 {
		t.Errorf("metadata read %d times, want once", n)
	}
}

// AckAll would let a later Ack confirm an earlier Nak'ed message; AckNone cannot
// redeliver. Only explicit acks are accepted.
func TestNewJetStreamNeedsExplicitAcks(t *testing.T) {
	h := register(t, newDeduper(t, memStore(t)), "orders", dedup.WithRetention(time.Hour))
	for _, p := range []jetstream.AckPolicy{jetstream.AckAllPolicy, jetstream.AckNonePolicy} {
		c := consumerWith(time.Second, 5)
		c.info.Config.AckPolicy = p
		_, err := NewJetStream(h, c)
		if !errors.Is(err, dedup.ErrInvalidOption) || !strings.Contains(err.Error(), "AckExplicitPolicy") {
			t.Errorf("ack policy %v: %v", p, err)
		}
	}
	if _, err := NewJetStream(h, consumerWith(time.Second, 5)); err != nil {
		t.Fatalf("explicit acks: %v", err)
	}
}

// A handler that ends its goroutine (runtime.Goexit, as t.FailNow does) must not
// leave its message signalled in progress forever; the message is Nak'ed, as after a
// panic, rather than left for AckWait.
func TestProgressStopsAndTheMessageIsNakedWhenTheHandlerExits(t *testing.T) {
	h := register(t, newDeduper(t, memStore(t)), "orders", dedup.WithRetention(time.Hour))
	a, err := NewJetStream(h, consumerWith(time.Second, 5), WithProgressEvery(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	msg := newFake("order-1", "a", 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.Handle(context.Background(), msg, func(context.Context, *Msg) error {
			// a few signals while it runs: waited for, as a loaded machine can hold the
			// 10ms timer up past any fixed sleep (35ms once saw none)
			for deadline := time.Now().Add(10 * time.Second); msg.progress.Load() < 3; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Error("no in-progress signals within 10s")
					break
				}
			}
			runtime.Goexit()
			return nil
		})
	}()
	<-done
	before := msg.progress.Load()
	time.Sleep(100 * time.Millisecond)
	if after := msg.progress.Load(); after != before || before == 0 {
		t.Fatalf("in-progress signals %d while running, %d after the handler exited", before, after-before)
	}
	msg.mu.Lock()
	defer msg.mu.Unlock()
	if len(msg.acks) != 1 || msg.acks[0] != "nak" {
		t.Fatalf("acks %q, want one nak", msg.acks)
	}
}
