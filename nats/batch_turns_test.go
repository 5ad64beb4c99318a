package nats

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/keys"
)

// Duplicates of a key being run, each in a batch of its own, do not hold the
// batcher's turns while they wait for the run: a message with another key is
// checked and run at once. (Turns went on only when a batch's first fn started.)
func TestWaitingBatchesHandTheirTurnsOn(t *testing.T) {
	eachServer(t, func(t *testing.T, e *env) {
		c, j := handlerJS(t, e, "turns", memStore(t), dedup.ModeDo, WithConcurrency(16), WithKeyStrategy(keys.Header("Idempotency-Key")))
		slowStarted := make(chan struct{})
		var slow atomic.Bool
		uRan := make(chan time.Time, 1)
		consume(t, c, j.Handler(context.Background(), func(ctx context.Context, m *Msg) error {
			switch m.Header("Idempotency-Key") {
			case "x":
				if slow.CompareAndSwap(false, true) {
					close(slowStarted)
					time.Sleep(3 * time.Second)
				}
			case "u":
				uRan <- time.Now()
			}
			return nil
		}))
		e.publish("new", "x1", "d", "Idempotency-Key", "x")
		<-slowStarted
		for i := 2; i <= 5; i++ {
			e.publish("new", fmt.Sprint("x", i), "d", "Idempotency-Key", "x")
			time.Sleep(100 * time.Millisecond)
		}
		t0 := time.Now()
		e.publish("new", "u1", "d", "Idempotency-Key", "u")
		select {
		case at := <-uRan:
			if d := at.Sub(t0); d > time.Second {
				t.Errorf("u's fn ran %v after it was published: it waited for x's run", d)
			} else {
				t.Logf("u ran after %v", d)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("u never ran")
		}
		e.settled(c, 6)
		j.Wait()
		if s := j.Stats(); s.Count(ActAck) != 6 {
			t.Errorf("actions %+v, want 6 acks (x once, its 4 copies as duplicates, u)", s)
		}
	})
}
