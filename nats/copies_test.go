package nats

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Orders published twice, back to back, to two instances with default options (the
// default 30 s lease): a copy that meets the other instance's run is held and
// answered soon after that run ends, not Nak'ed for the rest of the lease. Every
// order runs once, and everything settles long before one lease has passed.
func TestCopiesOfARunningMessageAreAnsweredSoonAfterTheRunEnds(t *testing.T) {
	eachServer(t, func(t *testing.T, e *env) {
		e.newStream()
		c := e.consumer("orders", func(cc *jetstream.ConsumerConfig) { cc.AckWait = 5 * time.Second })
		store := memStore(t) // shared by both instances, as Redis would be
		var r runs
		fn := func(ctx context.Context, m *Msg) error {
			r.add(m)
			time.Sleep(20 * time.Millisecond)
			return nil
		}
		var instances [2]*JetStream
		for i := range instances {
			h := register(t, newDeduper(t, store), "orders") // a Deduper each: two processes
			instances[i] = newJS(t, h, c)
			consume(t, c, instances[i].Handler(context.Background(), fn))
		}
		const orders = 40
		var last *jetstream.PubAck
		for i := range orders {
			id := fmt.Sprintf("order-%d", i)
			for range 2 { // a publisher's retry, right behind the first
				last = e.publish("new", "", id, "Idempotency-Key", id)
			}
		}
		start := time.Now()
		e.settled(c, last.Sequence) // within 15 s, half the default lease
		t.Logf("%d orders published twice settled in %v", orders, time.Since(start))

		var held, acks, naks uint64
		for _, j := range instances {
			s := j.Stats()
			held += s.Held
			acks += s.Count(ActAck)
			naks += s.Count(ActNakWithDelay)
		}
		if runs := r.all(); len(runs) != orders {
			t.Fatalf("%d orders ran, want %d", len(runs), orders)
		} else {
			for id, n := range runs {
				if n != 1 {
					t.Errorf("order %s ran %d times", id, n)
				}
			}
		}
		if acks != 2*orders {
			t.Errorf("%d acks, want %d (held %d, naks %d)", acks, 2*orders, held, naks)
		}
		t.Logf("held %d copies, %d naks", held, naks)
	})
}
