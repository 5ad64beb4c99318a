package dedup

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/embedded"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// BenchmarkRedisStore measures the store's single calls on unique keys from exactly c
// concurrent goroutines against DEDUP_REDIS_ADDR, and the naive SETNX for scale. ops/s is the figure to compare within one run.
//
//	DEDUP_REDIS_ADDR=127.0.0.1:6379 go test -run '^$' -bench redisstore.Store -benchmem ./dedup
func BenchmarkRedisStore(b *testing.B) {
	c, prefix := benchRedis(b)
	s, _ := redisstore.New(c)
	ops := []struct {
		name string
		run  func(ctx context.Context, s *redisstore.Store, key string) error
	}{
		{"mark", func(ctx context.Context, s *redisstore.Store, key string) error {
			_, err := mark1(ctx, s, key, "T", "", time.Minute)
			return err
		}},
		{"claim+complete", func(ctx context.Context, s *redisstore.Store, key string) error {
			if _, err := claim1(ctx, s, key, "T", "", time.Minute); err != nil {
				return err
			}
			return complete1(ctx, s, key, "T", time.Minute)
		}},
		{"naive-setnx", func(ctx context.Context, s *redisstore.Store, key string) error {
			return c.SetNX(ctx, key, "1", time.Minute).Err()
		}},
	}
	var seq atomic.Int64
	for _, op := range ops {
		for _, conc := range []int{1, 16, 64, 256} {
			b.Run(fmt.Sprintf("op=%s/conc=%d", op.name, conc), func(b *testing.B) {
				b.ReportAllocs()
				ctx := context.Background()
				start := time.Now()
				err := runConc(b.N, conc, func() error {
					return op.run(ctx, s, fmt.Sprintf("%s:k%d", prefix, seq.Add(1)))
				})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
			})
		}
	}
}

// BenchmarkRedisDo measures Handler.Do on unique keys from exactly c goroutines against
// DEDUP_REDIS_ADDR: the claim, the run (an empty fn) and the completion.
//
//	DEDUP_REDIS_ADDR=127.0.0.1:6379 go test -run '^$' -bench RedisDo -benchmem ./dedup
func BenchmarkRedisDo(b *testing.B) {
	c, prefix := benchRedis(b)
	tc := &testenv.TripCounter{}
	c.AddHook(tc)
	s, _ := redisstore.New(c)
	d, err := New(s, WithPrefix(prefix))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	var seq atomic.Int64 // keys stay unique across b.N's reruns
	for _, mode := range []struct {
		name string
		m    Mode
	}{{"do", ModeDo}, {"filter", ModeFilter}} {
		// records a cleanup missed expire soon rather than sit a day in a shared Redis
		h, err := d.Register("bench-"+mode.name, WithMode(mode.m), WithRetention(2*time.Minute))
		if err != nil {
			b.Fatal(err)
		}
		for _, conc := range []int{1, 64} {
			b.Run(fmt.Sprintf("mode=%s/conc=%d", mode.name, conc), func(b *testing.B) {
				b.ReportAllocs()
				ctx := context.Background()
				tc.Reset()
				start := time.Now()
				err := runConc(b.N, conc, func() error {
					res, err := handleKey(h, ctx, fmt.Sprint("k", seq.Add(1)), nil, func(context.Context) error { return nil })
					if err == nil && res.Outcome != Processed && res.Outcome != First {
						err = fmt.Errorf("outcome %v", res.Outcome)
					}
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
				b.ReportMetric(float64(tc.Cmds())/float64(max(1, tc.Trips())), "cmds/trip")
			})
		}
	}
}

// benchRedis returns a client of DEDUP_REDIS_ADDR and a key prefix whose keys are
// deleted at cleanup; without the variable the benchmark is skipped.
func benchRedis(b *testing.B) (*redis.Client, string) {
	addr := os.Getenv("DEDUP_REDIS_ADDR")
	if addr == "" {
		b.Skip("DEDUP_REDIS_ADDR is not set: no Redis to measure")
	}
	prefix := testenv.Prefix()
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 512})
	b.Cleanup(func() {
		// a run leaves hundreds of thousands of keys: more than DeletePrefix's 5s
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := embedded.DeleteKeys(ctx, c, prefix); err != nil {
			b.Errorf("cleanup of %s: %v", prefix, err)
		}
		c.Close()
	})
	return c, prefix
}

// runConc calls op n times from exactly conc goroutines (at least one;
// b.RunParallel would run a multiple of GOMAXPROCS, so conc=1 would be 2 here), and
// returns the first error, after which the goroutines stop.
func runConc(n, conc int, op func() error) error {
	conc = max(conc, 1)
	var (
		next    atomic.Int64
		failed  atomic.Bool
		errOnce sync.Once
		first   error
		wg      sync.WaitGroup
	)
	for range conc {
		wg.Go(func() {
			for next.Add(1) <= int64(n) && !failed.Load() {
				if err := op(); err != nil {
					errOnce.Do(func() { first = err })
					failed.Store(true)
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}
