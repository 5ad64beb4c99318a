package nats

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
)

// Two handlers with their own retention, on two durable consumers of one stream, each
// process every message exactly once, independently of each other. The store is
// Redis (miniredis), so that each record's TTL can be read.
func TestTwoHandlersOnOneStreamEachProcessEveryMessageOnce(t *testing.T) {
	const n, again = 200, 50 // messages, and how many are published twice with the same id
	eachServer(t, func(t *testing.T, e *env) {
		e.newStream()
		client, prefix := redisClients()["miniredis"](t)
		store, err := redisstore.New(client)
		if err != nil {
			t.Fatal(err)
		}
		d := newDeduper(t, store, dedup.WithPrefix(prefix))
		handlers := []struct {
			name      string
			retention time.Duration
			ack       Action
			opts      []Option
		}{
			{"inventory", time.Hour, ActAck, nil},
			{"email", 10 * time.Minute, ActDoubleAck, []Option{WithDoubleAck(true)}},
		}
		type run struct {
			h   *dedup.Handler
			j   *JetStream
			c   jetstream.Consumer
			r   *runs
			ack Action
		}
		var all []run
		for _, hc := range handlers {
			h := register(t, d, hc.name, dedup.WithRetention(hc.retention))
			c := e.consumer(hc.name, func(cc *jetstream.ConsumerConfig) {
				cc.MaxAckPending = 64
				// no redelivery for slowness on a loaded machine: the counts below are exact
				cc.AckWait = 10 * time.Second
			})
			j := newJS(t, h, c, hc.opts...)
			r := &runs{}
			consume(t, c, j.Handler(context.Background(), func(_ context.Context, m *Msg) error { r.add(m); return nil }))
			all = append(all, run{h, j, c, r, hc.ack})
		}

		id := func(i int) string { return fmt.Sprintf("m-%03d", i) }
		for i := range n {
			e.publish("new", id(i), "payload "+id(i))
		}
		var last *jetstream.PubAck
		for i := 0; i < n; i += n / again {
			last = e.republish("new", id(i), "payload "+id(i))
		}
		if last.Sequence != n+again {
			t.Fatalf("stream holds %d messages, want %d", last.Sequence, n+again)
		}
		for _, a := range all {
			e.settled(a.c, last.Sequence)
		}
		for _, a := range all {
			name := a.h.Name()
			if got := a.r.n.Load(); got != n {
				t.Errorf("%s ran %d times, want %d", name, got, n)
			}
			for i := range n {
				if a.r.of(id(i)) != 1 {
					t.Fatalf("%s ran %s %d times", name, id(i), a.r.of(id(i)))
				}
			}
			if got := a.h.Stats().Count(dedup.Duplicate); got != again {
				t.Errorf("%s: %d duplicates, want %d", name, got, again)
			}
			// An ack counts once its call returns; a double ack's returns with the
			// server's reply, which can come after the ack floor seen by settled moved.
			a.j.Wait()
			s := a.j.Stats()
			if s.Count(a.ack) != n+again || s.AckErrors != 0 {
				t.Errorf("%s: %d × %v, %d ack errors; want %d and none", name, s.Count(a.ack), a.ack, s.AckErrors, n+again)
			}
			ttl, err := client.PTTL(context.Background(), a.h.RecordKey(id(n-1))).Result()
			if err != nil || ttl <= a.h.Retention()-time.Minute || ttl > a.h.Retention() {
				t.Errorf("%s: record TTL %v (%v), want its retention %v", name, ttl, err, a.h.Retention())
			}
		}
	})
}
