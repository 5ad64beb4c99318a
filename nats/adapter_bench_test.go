package nats

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// BenchmarkHandle measures the adapter's own cost per JetStream delivery (key, view,
// progress timer, outcome, ack) over the memory store, with fake deliveries whose
// acks are recorded in memory. answer=first runs fn for a new key each time;
// answer=duplicate answers a key the local tier holds.
//
//	go test -run '^$' -bench BenchmarkHandle -benchmem ./nats
func BenchmarkHandle(b *testing.B) {
	for _, mode := range []struct {
		name string
		m    dedup.Mode
	}{{"do", dedup.ModeDo}, {"filter", dedup.ModeFilter}} {
		for _, answer := range []string{"first", "duplicate"} {
			b.Run(fmt.Sprintf("mode=%s/answer=%s", mode.name, answer), func(b *testing.B) {
				store, err := memstore.New(memstore.WithLimit(1 << 24))
				if err != nil {
					b.Fatal(err)
				}
				d, err := dedup.New(store)
				if err != nil {
					b.Fatal(err)
				}
				defer d.Close()
				h, err := d.Register("orders", dedup.WithMode(mode.m))
				if err != nil {
					b.Fatal(err)
				}
				cfg, err := newConfig(h, nil)
				if err != nil {
					b.Fatal(err)
				}
				j := &JetStream{adapter{h: h, cfg: cfg}}
				ctx := context.Background()
				fn := func(context.Context, *Msg) error { return nil }
				j.Handle(ctx, newFake("dup", "payload", 1), fn)
				var seq atomic.Int64
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						id := "dup"
						if answer == "first" {
							id = fmt.Sprint("id-", seq.Add(1))
						}
						if _, act := j.Handle(ctx, newFake(id, "payload", 1), fn); act != ActAck {
							b.Errorf("action %v, want ack", act)
							return
						}
					}
				})
			})
		}
	}
}

// benchRetention is BenchmarkHandler's: the records of a run whose cleanup gave up
// (hundreds of thousands of keys in a shared server) expire within minutes, not a day.
const benchRetention = 10 * time.Minute

// BenchmarkHandler measures the Consume handler's path (Handler with concurrency
// 128: micro-batches through HandleBatchParallel, the acks) per message, with fake
// deliveries, over the real Redis at DEDUP_REDIS_ADDR (or the memory store): the
// client's cost of the JetStream figures of the bench, without nats.go's own. The
// fake deliveries' construction (about 6 allocations) is counted in.
//
//	DEDUP_REDIS_ADDR=127.0.0.1:6379 go test -run '^$' -bench BenchmarkHandler -benchmem ./nats
func BenchmarkHandler(b *testing.B) {
	for _, store := range []string{"memory", "redis"} {
		for _, mode := range []struct {
			name string
			m    dedup.Mode
		}{{"do", dedup.ModeDo}, {"filter", dedup.ModeFilter}} {
			b.Run(fmt.Sprintf("store=%s/mode=%s", store, mode.name), func(b *testing.B) {
				var s driver.Store
				prefix := testenv.Prefix()
				if store == "memory" {
					s, _ = memstore.New(memstore.WithLimit(1 << 26))
				} else {
					addr := os.Getenv("DEDUP_REDIS_ADDR")
					if addr == "" {
						b.Skip("DEDUP_REDIS_ADDR is not set")
					}
					c := redis.NewClient(&redis.Options{Addr: addr})
					b.Cleanup(func() {
						testenv.DeletePrefix(b, c, prefix)
						c.Close()
					})
					s, _ = redisstore.New(c)
				}
				d, err := dedup.New(s, dedup.WithPrefix(prefix))
				if err != nil {
					b.Fatal(err)
				}
				defer d.Close()
				h, err := d.Register("orders", dedup.WithMode(mode.m), dedup.WithRetention(benchRetention))
				if err != nil {
					b.Fatal(err)
				}
				cfg, err := newConfig(h, []Option{WithConcurrency(128)})
				if err != nil {
					b.Fatal(err)
				}
				j := &JetStream{adapter{h: h, cfg: cfg}}
				handler := j.Handler(context.Background(), func(context.Context, *Msg) error { return nil })
				msgs := make([]*fakeMsg, b.N)
				for i := range msgs {
					msgs[i] = newFake(fmt.Sprint("id-", i), "payload", 1)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for _, m := range msgs {
					handler(m)
				}
				j.Wait()
				b.StopTimer()
				for _, m := range msgs {
					if got := m.got(); len(got) != 1 || got[0] != "ack" {
						b.Fatalf("acks %v, want one ack", got)
					}
				}
			})
		}
	}
}
