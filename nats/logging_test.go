package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/internal/testenv"
	"github.com/dedupkit/dedupkit/keys"
)

// failingAck is a delivery whose Ack fails.
type failingAck struct{ *fakeMsg }

func (failingAck) Ack() error { return errors.New("nats: timeout") }

// Every log line of the adapter (and of the engine under it), driven with a
// recognisable Nats-Msg-Id and payload, names the delivery by stream and sequence:
// no line holds the key, its normalised form, its record key or the payload.
func TestLogsHoldNoKeyOrPayload(t *testing.T) {
	const payloadA, payloadB = "SECRET-PAYLOAD-A-5d1e", "SECRET-PAYLOAD-B-0c77"
	boom := func(context.Context, *Msg) error { return errors.New("failed on " + payloadA) }
	type scenario struct {
		name  string
		hopts []dedup.HandlerOption
		opts  []Option
		run   func(t *testing.T, j *JetStream, h *dedup.Handler, s *flakyStore, key string)
		want  []string // messages that must be logged
	}
	handle := func(t *testing.T, j *JetStream, m jetstream.Msg, fn Func) {
		if fn == nil {
			fn = func(context.Context, *Msg) error { return nil }
		}
		j.Handle(context.Background(), m, fn)
	}
	scenarios := []scenario{
		{name: "no key", opts: []Option{WithKeyStrategy(keys.Header("Order-Id"))},
			run: func(t *testing.T, j *JetStream, _ *dedup.Handler, _ *flakyStore, key string) {
				handle(t, j, newFake(key, payloadA, 1), nil)
			}, want: []string{"terminating message"}},
		{name: "key reuse", hopts: []dedup.HandlerOption{dedup.WithFingerprint(true)},
			run: func(t *testing.T, j *JetStream, _ *dedup.Handler, _ *flakyStore, key string) {
				handle(t, j, newFake(key, payloadA, 1), nil)
				handle(t, j, newFake(key, payloadB, 1), nil)
			}, want: []string{"terminating message", "key reused"}},
		{name: "exhausted", run: func(t *testing.T, j *JetStream, _ *dedup.Handler, _ *flakyStore, key string) {
			handle(t, j, newFake(key, payloadA, 5), boom)
		}, want: []string{"last delivery"}},
		{name: "store down, last delivery", run: func(t *testing.T, j *JetStream, _ *dedup.Handler, s *flakyStore, key string) {
			s.down(true)
			handle(t, j, newFake(key, payloadA, 5), nil)
		}, want: []string{"last delivery", "failing closed"}},
		{name: "ack failed", run: func(t *testing.T, j *JetStream, _ *dedup.Handler, _ *flakyStore, key string) {
			handle(t, j, failingAck{newFake(key, payloadA, 1)}, nil)
		}, want: []string{"acknowledgement failed"}},
		{name: "batch", opts: []Option{WithKeyStrategy(keys.FirstOf(keys.Header("Order-Id"), keys.Header(jetstream.MsgIDHeader)))},
			run: func(t *testing.T, j *JetStream, _ *dedup.Handler, _ *flakyStore, key string) {
				keyless := newFake("", payloadB, 1)
				if _, err := j.HandleBatch(context.Background(), newBatch(nil, newFake(key, payloadA, 5), keyless), boom); err != nil {
					t.Fatal(err)
				}
			}, want: []string{"last delivery", "terminating message"}},
	}
	for _, key := range []string{"SECRET-KEY-42e1", "SECRET key, hashed: " + strings.Repeat("ü", 40)} {
		for _, sc := range scenarios {
			t.Run(fmt.Sprintf("%s/%d", sc.name, len(key)), func(t *testing.T) {
				logs := &testenv.LogBuffer{}
				logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
				store := &flakyStore{Store: memStore(t)}
				d := newDeduper(t, store, dedup.WithLogger(logger))
				h := register(t, d, "orders", sc.hopts...)
				j, err := NewJetStream(h, consumerWith(time.Second, 5), append([]Option{WithLogger(logger)}, sc.opts...)...)
				if err != nil {
					t.Fatal(err)
				}
				sc.run(t, j, h, store, key)
				d.Close()
				out := logs.String()
				for _, w := range sc.want {
					if !strings.Contains(out, w) {
						t.Fatalf("no %q line in the logs:\n%s", w, out)
					}
				}
				if !strings.Contains(out, `"stream_seq":"7"`) {
					t.Fatalf("the lines do not name the stream sequence:\n%s", out)
				}
				for _, secret := range []string{key, keys.Normalize(key), h.RecordKey(key), payloadA, payloadB} {
					if strings.Contains(out, secret) {
						t.Fatalf("a log line holds %q:\n%s", secret, out)
					}
				}
			})
		}
	}
}

// The Replier's own log lines (a stored reply it cannot read, a reply the connection
// did not take), and the engine's under it (a reply too large), hold neither the
// reply, nor the request, nor its key.
func TestReplierLogsHoldNoReply(t *testing.T) {
	const key, request, secret = "SECRET-KEY-71aa", "SECRET-REQUEST-3b0d", "SECRET-REPLY-e4c2"
	logs := &testenv.LogBuffer{}
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	d, err := dedup.New(memStore(t), dedup.WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	h, err := d.Register("orders", dedup.WithReplies(64))
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewReplier(h, WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// a record whose reply is not one of this package's (another program's run)
	if r := h.Run(ctx, []dedup.Item{{Key: key}}, func(ctx context.Context, _ int) error {
		return dedup.SetReply(ctx, []byte(secret))
	}); r[0].Err != nil {
		t.Fatal(r[0].Err)
	}
	msg := func(k string) *natsgo.Msg {
		// a reply subject, and no connection to answer on: the reply is not sent
		return &natsgo.Msg{Subject: "orders", Reply: "_INBOX.x", Header: natsgo.Header{"Idempotency-Key": {k}}, Data: []byte(request)}
	}
	r.Handle(ctx, msg(key), func(context.Context, *Msg) (Reply, error) {
		t.Error("fn ran for a duplicate")
		return Reply{}, nil
	})
	r.Handle(ctx, msg(key+"-2"), func(context.Context, *Msg) (Reply, error) {
		return Reply{Data: []byte(secret + strings.Repeat("x", 100))}, nil // too large
	})
	out := logs.String()
	for _, want := range []string{"stored reply unreadable", "reply not sent", "reply too large"} {
		if !strings.Contains(out, want) {
			t.Fatalf("no %q line:\n%s", want, out)
		}
	}
	for _, s := range []string{key, request, secret} {
		if strings.Contains(out, s) {
			t.Fatalf("a log line holds %q:\n%s", s, out)
		}
	}
	if s := r.Stats(); s.RespondErrors != 2 {
		t.Fatalf("stats: %+v", s)
	}
}
