package nats

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// panicky is a delivery whose methods panic: something the adapter cannot map.
type panicky struct{ *fakeMsg }

func (panicky) Headers() natsgo.Header { panic("headers exploded") }

// Bad input to the adapter is never a panic: a nil message is dropped with a log
// line, a nil function or context (or transactor) Naks the message after the
// failure backoff with a log line, and a message the adapter cannot read is
// recovered on its goroutine, logged and Nak'ed.
func TestAdapterBadInputIsLoggedNeverAPanic(t *testing.T) {
	store := memStore(t)
	h := register(t, newDeduper(t, store), "orders")
	logs := &testenv.LogBuffer{}
	newAdapter := func(opts ...Option) *JetStream {
		j, err := NewJetStream(h, consumerWith(time.Second, 5), append([]Option{WithLogger(slog.New(slog.NewTextHandler(logs, nil)))}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	j := newAdapter()
	one := newAdapter(WithConcurrency(1))
	ran := 0
	fn := func(context.Context, *Msg) error { ran++; return nil }
	var nilCtx context.Context
	var nilMsg *fakeMsg
	noPanic := func(t *testing.T, name string, f func()) {
		t.Helper()
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("%s panicked: %v", name, r)
			}
		}()
		f()
	}
	nakked := func(t *testing.T, name string, m *fakeMsg) {
		t.Helper()
		testenv.Eventually(t, 5*time.Second, name+" acknowledged", func() bool { return len(m.got()) > 0 })
		if got := m.got(); len(got) != 1 || !strings.HasPrefix(got[0], "nak-with-delay") {
			t.Fatalf("%s: message got %q, want a nak-with-delay", name, got)
		}
	}

	t.Run("nil message to a Handler", func(t *testing.T) {
		noPanic(t, "Handler(nil)", func() { j.Handler(context.Background(), fn)(nil) })
		noPanic(t, "Handler(typed nil)", func() { j.Handler(context.Background(), fn)(nilMsg) })
		noPanic(t, "one at a time", func() { one.Handler(context.Background(), fn)(nil) })
		j.Wait()
		one.Wait()
	})
	t.Run("nil message to Handle", func(t *testing.T) {
		var res dedup.Result
		var act Action
		noPanic(t, "Handle(nil)", func() { res, act = j.Handle(context.Background(), nil, fn) })
		if res.Outcome != 0 || act != ActNone {
			t.Fatalf("%v %v", res.Outcome, act)
		}
	})
	t.Run("nil function to Handle", func(t *testing.T) {
		m := newFake("o-1", "a", 1)
		noPanic(t, "Handle(nil fn)", func() { j.Handle(context.Background(), m, nil) })
		nakked(t, "Handle(nil fn)", m)
	})
	t.Run("nil context to Handle", func(t *testing.T) {
		m := newFake("o-2", "a", 1)
		noPanic(t, "Handle(nil ctx)", func() { j.Handle(nilCtx, m, fn) })
		nakked(t, "Handle(nil ctx)", m)
	})
	t.Run("nil function to a Handler", func(t *testing.T) {
		m := newFake("o-3", "a", 1)
		noPanic(t, "Handler(nil fn)", func() { j.Handler(context.Background(), nil)(m) })
		nakked(t, "Handler(nil fn)", m)
	})
	t.Run("nil batch", func(t *testing.T) {
		var err error
		noPanic(t, "HandleBatch(nil)", func() { _, err = j.HandleBatch(context.Background(), nil, fn) })
		if !errors.Is(err, dedup.ErrInvalidOption) {
			t.Fatalf("HandleBatch(nil): %v", err)
		}
	})
	t.Run("nil transactor", func(t *testing.T) {
		m := newFake("o-4", "a", 1)
		noPanic(t, "HandleTx(nil t)", func() {
			HandleTx[*struct{}](context.Background(), j, m, nil, func(context.Context, *Msg, *struct{}) error { return nil })
		})
		nakked(t, "HandleTx(nil t)", m)
		m = newFake("o-5", "a", 1)
		noPanic(t, "TxHandler(nil t)", func() {
			TxHandler[*struct{}](context.Background(), j, nil, func(context.Context, *Msg, *struct{}) error { return nil })(m)
		})
		nakked(t, "TxHandler(nil t)", m)
		noPanic(t, "HandleTx(nil j)", func() { HandleTx[*struct{}](context.Background(), nil, m, nil, nil) })
	})
	t.Run("a message the adapter cannot read", func(t *testing.T) {
		m := newFake("o-6", "a", 1)
		noPanic(t, "Handler(panicky)", func() { one.Handler(context.Background(), fn)(panicky{m}) })
		one.Wait()
		if got := m.got(); len(got) != 1 || got[0] != "nak" {
			t.Fatalf("message got %q, want a nak", got)
		}
		if !strings.Contains(logs.String(), "recovered from a panic") {
			t.Fatalf("no log line: %s", logs.String())
		}
	})
	t.Run("core and replier", func(t *testing.T) {
		c, err := NewCore(h, WithLogger(quiet))
		if err != nil {
			t.Fatal(err)
		}
		noPanic(t, "Core.Handler(nil)", func() { c.Handler(context.Background(), fn)(nil) })
		noPanic(t, "Core.Handle(nil)", func() { c.Handle(context.Background(), nil, fn) })
		noPanic(t, "Core.Handle(nil fn)", func() { c.Handle(context.Background(), &natsgo.Msg{Subject: "s"}, nil) })
		c.Wait()
		rh := register(t, newDeduper(t, store), "requests", dedup.WithReplies(0))
		r, err := NewReplier(rh, WithLogger(quiet))
		if err != nil {
			t.Fatal(err)
		}
		noPanic(t, "Replier.Handler(nil)", func() { r.Handler(context.Background(), nil)(nil) })
		var rerr error
		noPanic(t, "Replier.Handle(nil)", func() { _, rerr = r.Handle(context.Background(), nil, nil) })
		if !errors.Is(rerr, dedup.ErrInvalidOption) {
			t.Fatalf("Replier.Handle(nil): %v", rerr)
		}
		noPanic(t, "Replier.Handle(nil fn)", func() {
			_, rerr = r.Handle(context.Background(), &natsgo.Msg{Subject: "s", Header: natsgo.Header{"Idempotency-Key": {"k"}}}, nil)
		})
		if !errors.Is(rerr, dedup.ErrInvalidOption) {
			t.Fatalf("Replier.Handle(nil fn): %v", rerr)
		}
		noPanic(t, "MicroHandler(nil)", func() { r.MicroHandler(context.Background(), nil).Handle(nil) })
		r.Wait()
	})
	t.Run("nil adapters", func(t *testing.T) {
		var nj *JetStream
		var nc *Core
		var nr *Replier
		m := newFake("o-7", "a", 2)
		noPanic(t, "nil JetStream Handler", func() { nj.Handler(context.Background(), fn)(m) })
		if got := m.got(); len(got) != 1 || !strings.HasPrefix(got[0], "nak-with-delay") {
			t.Fatalf("a message handed to a nil JetStream got %q, want a nak-with-delay", got)
		}
		m = newFake("o-8", "a", 1)
		noPanic(t, "nil JetStream Handle", func() { nj.Handle(context.Background(), m, fn) })
		noPanic(t, "nil TxHandler", func() {
			TxHandler[*struct{}](context.Background(), nil, nil, nil)(newFake("o-9", "a", 1))
		})
		noPanic(t, "nil JetStream accessors", func() { nj.Wait(); _ = nj.Stats() })
		noPanic(t, "nil Core", func() {
			nc.Handler(context.Background(), fn)(&natsgo.Msg{Subject: "s"})
			nc.Handle(context.Background(), &natsgo.Msg{Subject: "s"}, fn)
			nc.Wait()
			_ = nc.Stats()
		})
		noPanic(t, "nil Replier", func() {
			nr.Handler(context.Background(), nil)(&natsgo.Msg{Subject: "s"})
			_, _ = nr.Handle(context.Background(), &natsgo.Msg{Subject: "s"}, nil)
			nr.MicroHandler(context.Background(), nil).Handle(nil)
			nr.Wait()
			_ = nr.Stats()
		})
	})
	if ran != 0 {
		t.Fatalf("fn ran %d times on bad input", ran)
	}
}
