package nats

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// Core NATS in filter mode: the same Nats-Msg-Id twice runs once, a message without a
// key does not run, and nothing is acknowledged (there is nothing to acknowledge).
func TestCoreFilterModeRunsEachIDOnceAndAcksNothing(t *testing.T) {
	eachServer(t, func(t *testing.T, e *env) {
		h := register(t, newDeduper(t, memStore(t)), "metrics", dedup.WithMode(dedup.ModeFilter))
		core, err := NewCore(h, WithLogger(quiet))
		if err != nil {
			t.Fatal(err)
		}
		var r runs
		sub, err := e.nc.Subscribe(e.subject+".core", core.Handler(context.Background(), func(_ context.Context, m *Msg) error {
			r.add(m)
			return nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
		if err := e.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		send := func(id, data string) {
			m := natsgo.NewMsg(e.subject + ".core")
			m.Data = []byte(data)
			if id != "" {
				m.Header.Set(jetstream.MsgIDHeader, id)
			}
			if err := e.nc.PublishMsg(m); err != nil {
				t.Fatal(err)
			}
		}
		send("a", "first")
		send("a", "again")
		send("", "no key")
		send("b", "other")
		testenv.Eventually(t, 5*time.Second, "four messages handled", func() bool {
			s := h.Stats()
			return s.Count(dedup.Processed)+s.Count(dedup.Duplicate)+s.Count(dedup.NoKey) == 4
		})
		// the handler counts a message before the adapter settles it: wait for those
		core.Wait()
		s := h.Stats()
		if r.of("a") != 1 || r.of("b") != 1 || r.of("no key") != 0 || s.Count(dedup.Duplicate) != 1 || s.Count(dedup.NoKey) != 1 {
			t.Fatalf("runs %v; %d duplicates, %d without key", r.all(), s.Count(dedup.Duplicate), s.Count(dedup.NoKey))
		}
		if cs := core.Stats(); cs.Count(ActNone) != 4 {
			t.Fatalf("core acknowledged something: %+v", cs)
		}
	})
}

// A push subscription of the older JetStreamContext, with ManualAck: a failure is
// nakked and redelivered, a duplicate acked, a message failing on its last delivery
// handed to the exhausted hook and terminated.
func TestLegacyPushSubscriptionAcksNaksAndTerminatesByOutcome(t *testing.T) {
	eachServer(t, func(t *testing.T, e *env) {
		e.newStream()
		h := register(t, newDeduper(t, memStore(t)), "orders")
		var mu sync.Mutex
		var exhausted []uint64
		core, err := NewCore(h, WithLogger(quiet), WithMaxDeliver(3),
			WithBackoff(func(uint64) time.Duration { return time.Millisecond }),
			WithExhausted(func(_ context.Context, m *Msg, _ error) {
				mu.Lock()
				exhausted = append(exhausted, m.NumDelivered())
				mu.Unlock()
			}))
		if err != nil {
			t.Fatal(err)
		}
		attempts := map[string]int{}
		var r runs
		js, err := e.nc.JetStream()
		if err != nil {
			t.Fatal(err)
		}
		sub, err := js.Subscribe(e.subject+".>", core.Handler(context.Background(), func(_ context.Context, m *Msg) error {
			mu.Lock()
			attempts[string(m.Data())]++
			n := attempts[string(m.Data())]
			mu.Unlock()
			if string(m.Data()) == "always fails" || (string(m.Data()) == "fails once" && n == 1) {
				return errors.New("boom")
			}
			r.add(m)
			return nil
		}), natsgo.BindStream("DKT_"+e.id), natsgo.ManualAck(), natsgo.AckExplicit(), natsgo.AckWait(5*time.Second), natsgo.MaxDeliver(3), natsgo.DeliverAll())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })

		e.publish("new", "p-1", "fails once")
		e.publish("new", "p-2", "always fails")
		e.republish("new", "p-1", "fails once") // a duplicate
		testenv.Eventually(t, 10*time.Second, "every message acked or terminated", func() bool {
			ci, err := sub.ConsumerInfo()
			return err == nil && ci.NumAckPending == 0 && ci.NumPending == 0 && ci.AckFloor.Stream == 3
		})
		core.Wait() // an action is counted once its call returns: after the server has the ack
		ci, err := sub.ConsumerInfo()
		if err != nil {
			t.Fatal(err)
		}
		// deliveries: p-1 twice, p-2 three times, the duplicate once
		if ci.Delivered.Consumer != 6 {
			t.Fatalf("server delivered %d times, want 6", ci.Delivered.Consumer)
		}
		mu.Lock()
		defer mu.Unlock()
		if r.of("p-1") != 1 || r.of("p-2") != 0 || len(exhausted) != 1 || exhausted[0] != 3 {
			t.Fatalf("runs %v, exhausted %v", r.all(), exhausted)
		}
		s := core.Stats()
		if s.Count(ActAck) != 2 || s.Count(ActNakWithDelay) != 3 || s.Count(ActTerm) != 1 {
			t.Fatalf("actions: ack %d, nak-with-delay %d, term %d", s.Count(ActAck), s.Count(ActNakWithDelay), s.Count(ActTerm))
		}
	})
}
