package nats

import (
	"context"
	"testing"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/keys"
)

// The default key is one order for the engine and every adapter: Idempotency-Key,
// else Nats-Msg-Id, else the stream name and stream sequence (a message republished
// without either header is a new message). A message carrying only Idempotency-Key
// is deduplicated by it.
func TestDefaultKeyIsIdempotencyKeyThenMsgIDThenSequence(t *testing.T) {
	eachServer(t, func(t *testing.T, e *env) {
		s := e.newStream()
		c := e.consumer("orders")
		store := memStore(t)
		h := register(t, newDeduper(t, store), "orders")
		j := newJS(t, h, c, WithConcurrency(1)) // in order: the first copy is the one that runs
		var r runs
		consume(t, c, j.Handler(context.Background(), func(_ context.Context, m *Msg) error { r.add(m); return nil }))

		e.publish("new", "order-1", "with id")
		e.publish("new", "", "no id")
		e.publish("new", "", "no id") // the same payload again: another message
		e.publish("new", "", "idempotency key only", "Idempotency-Key", "idem-1")
		e.publish("new", "", "idempotency key only", "Idempotency-Key", "idem-1") // a publisher's retry
		last := e.publish("new", "msg-2", "both", "Idempotency-Key", "idem-2")
		e.settled(c, last.Sequence)

		name := s.CachedInfo().Config.Name
		for _, k := range []string{"order-1", "js:" + name + ":2", "js:" + name + ":3", "idem-1", "idem-2"} {
			if !isDone(t, store, h, k) {
				t.Errorf("no DONE record under key %q", k)
			}
		}
		for _, k := range []string{"js:" + name + ":1", "js:" + name + ":4", "js:" + name + ":5", "msg-2"} {
			if isDone(t, store, h, k) {
				t.Errorf("a DONE record under key %q", k)
			}
		}
		if r.n.Load() != 5 || r.of("no id") != 2 || r.of("idempotency key only") != 1 {
			t.Fatalf("runs %v; want 5 in all, the id-less payload twice, the Idempotency-Key one once", r.all())
		}
		if got := j.Stats().Count(ActAck); got != 6 {
			t.Fatalf("%d acks, want 6 (the copy is a duplicate, acked)", got)
		}
	})
}

// The engine's default (Handle) and every adapter's read the same headers in the
// same order.
func TestEngineAndAdaptersReadTheDefaultKeyInOneOrder(t *testing.T) {
	both := keys.Raw{Headers: map[string]string{"Idempotency-Key": "idem", "Nats-Msg-Id": "mid"}}
	msgID := keys.Raw{Headers: map[string]string{"Nats-Msg-Id": "mid"}}
	for name, m := range map[string]keys.Raw{"both": both, "msg id only": msgID} {
		if a, b := dedup.DefaultKeyStrategy.Key(m), DefaultKeyStrategy.Key(m); a != b || a == "" {
			t.Errorf("%s: engine %q, adapters %q", name, a, b)
		}
	}
	if got := DefaultKeyStrategy.Key(both); got != "idem" {
		t.Errorf("Idempotency-Key and Nats-Msg-Id: key %q, want the Idempotency-Key", got)
	}
	core := viewCore(&natsgo.Msg{Subject: "s", Header: natsgo.Header{"Idempotency-Key": {"idem"}}})
	if got := DefaultKeyStrategy.Key(core); got != "idem" {
		t.Errorf("core message: key %q", got)
	}
}

// A strategy given to the dedup handler is used; one given to the adapter wins over it.
func TestAdaptersKeyStrategyWinsOverTheHandlers(t *testing.T) {
	eachServer(t, func(t *testing.T, e *env) {
		e.newStream()
		byHandler := e.consumer("by-handler")
		byOption := e.consumer("by-option")
		store := memStore(t)
		d := newDeduper(t, store)
		hh := register(t, d, "by-handler", dedup.WithKeyStrategy(keys.Header("Order-Id")))
		ho := register(t, d, "by-option", dedup.WithKeyStrategy(keys.Header("Order-Id")))
		// one at a time: which of two messages with one key runs is then decided by order
		jh := newJS(t, hh, byHandler, WithConcurrency(1))
		jo := newJS(t, ho, byOption, WithKeyStrategy(keys.Payload()), WithConcurrency(1))
		var rh, ro runs
		consume(t, byHandler, jh.Handler(context.Background(), func(_ context.Context, m *Msg) error { rh.add(m); return nil }))
		consume(t, byOption, jo.Handler(context.Background(), func(_ context.Context, m *Msg) error { ro.add(m); return nil }))

		// ids all differ; Order-Id repeats in 1 and 2; the payload repeats in 2 and 3
		e.publish("new", "id-1", "apples", "Order-Id", "o-1")
		e.publish("new", "id-2", "pears", "Order-Id", "o-1")
		last := e.publish("new", "id-3", "pears", "Order-Id", "o-2")
		e.settled(byHandler, last.Sequence)
		e.settled(byOption, last.Sequence)
		jh.Wait() // the acks settled saw are counted once their calls return
		jo.Wait()

		if rh.of("id-1") != 1 || rh.of("id-2") != 0 || rh.of("id-3") != 1 {
			t.Fatalf("handler's strategy (Order-Id): runs %v", rh.all())
		}
		if !isDone(t, store, hh, "o-1") || !isDone(t, store, hh, "o-2") || isDone(t, store, hh, "id-1") {
			t.Fatal("handler's strategy: records not under Order-Id")
		}
		if ro.of("id-1") != 1 || ro.of("id-2") != 1 || ro.of("id-3") != 0 {
			t.Fatalf("adapter's strategy (payload): runs %v", ro.all())
		}
		pears := keys.Payload().Key(keys.Raw{Body: []byte("pears")})
		if pears == "" || !isDone(t, store, ho, pears) || isDone(t, store, ho, "o-1") {
			t.Fatal("adapter's strategy: records not under the payload key")
		}
		if jh.Stats().Count(ActAck) != 3 || jo.Stats().Count(ActAck) != 3 {
			t.Fatal("not every message acked")
		}
	})
}

func TestStreamSequenceKeysAMessageByStreamAndSequence(t *testing.T) {
	js := viewJS(newFake("", "x", 2))
	if got := StreamSequence().Key(js); got != "js:S:7" {
		t.Fatalf("jetstream message: %q", got)
	}
	if got := DefaultKeyStrategy.Key(js); got != "js:S:7" {
		t.Fatalf("default, no id: %q", got)
	}
	withID := viewJS(newFake("order-1", "x", 2))
	if got := DefaultKeyStrategy.Key(withID); got != "order-1" {
		t.Fatalf("default, with id: %q", got)
	}
	core := viewCore(&natsgo.Msg{Subject: "s", Data: []byte("x")})
	for name, m := range map[string]keys.Message{
		"core":       core,
		"nil":        (*Msg)(nil),
		"raw":        keys.Raw{Body: []byte("x")},
		"no stream":  &Msg{meta: &jetstream.MsgMetadata{}},
		"core msgid": viewCore(&natsgo.Msg{Subject: "s", Header: natsgo.Header{"Nats-Msg-Id": {"m"}}}),
	} {
		if got := StreamSequence().Key(m); got != "" {
			t.Errorf("%s: %q, want no key", name, got)
		}
	}
	if got := DefaultKeyStrategy.Key(core); got != "" {
		t.Fatalf("core message without id: %q", got)
	}
}

// Msg.Header matches the name as given, then canonically.
func TestMsgHeaderMatchesTheNameAsGivenThenCanonically(t *testing.T) {
	m := &Msg{header: natsgo.Header{"Nats-Msg-Id": {"a"}, "lower-case": {"b"}}}
	for name, want := range map[string]string{"Nats-Msg-Id": "a", "nats-msg-id": "a", "lower-case": "b", "Lower-Case": "", "absent": ""} {
		if got := m.Header(name); got != want {
			t.Errorf("Header(%q) = %q, want %q", name, got, want)
		}
	}
	var none Msg
	if none.Header("x") != "" || none.NumDelivered() != 0 || none.Metadata() != nil {
		t.Fatal("empty message")
	}
}
