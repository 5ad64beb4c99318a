package nats

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/keys"
)

// 600 messages on 60 keys through a batching Handler, 16 at once, in both modes: each
// key runs once, and in ModeDo never twice at once.
func TestHandlerHotKeysRunOnce(t *testing.T) {
	forModes(t, func(t *testing.T, mode dedup.Mode) {
		eachServer(t, func(t *testing.T, e *env) {
			c, j := handlerJS(t, e, "stress", memStore(t), mode, WithConcurrency(16), WithKeyStrategy(keys.Header("Idempotency-Key")))
			var mu sync.Mutex
			runs := map[string]int{}
			running := map[string]int{}
			var last *jetstream.PubAck
			for i := range 600 {
				last = e.publish("new", fmt.Sprint("m", i), "d", "Idempotency-Key", fmt.Sprint("k", rand.IntN(60)))
			}
			consume(t, c, j.Handler(context.Background(), func(ctx context.Context, m *Msg) error {
				k := m.Header("Idempotency-Key")
				mu.Lock()
				running[k]++
				if running[k] > 1 && mode == dedup.ModeDo {
					t.Errorf("%s runs twice at once", k)
				}
				mu.Unlock()
				time.Sleep(time.Duration(rand.IntN(4000)) * time.Microsecond)
				mu.Lock()
				running[k]--
				runs[k]++
				mu.Unlock()
				return nil
			}))
			e.settled(c, last.Sequence)
			j.Wait()
			mu.Lock()
			defer mu.Unlock()
			for k, n := range runs {
				if n != 1 {
					t.Errorf("%s ran %d times", k, n)
				}
			}
			if s := j.Stats(); s.Count(ActAck) != 600 {
				t.Errorf("actions %+v, want 600 acks", s)
			}
		})
	})
}
