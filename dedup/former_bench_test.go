package dedup

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// BenchmarkFormerNames measures what former names cost a miss (a key new under every
// name): Handle on unique keys, in ModeDo (claim, empty fn, completion) and ModeFilter
// (mark), with 0, 1 and 3 former names, from exactly 1 and 64 goroutines, against
// DEDUP_REDIS_ADDR. trips/op is the round trips per miss the client sent (the lookup
// of the former names adds one).
//
//	DEDUP_REDIS_ADDR=127.0.0.1:6379 go test -run '^$' -bench FormerNames -benchmem ./dedup
func BenchmarkFormerNames(b *testing.B) {
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
		for _, formers := range []int{0, 1, 3} {
			var names []string
			for i := range formers {
				names = append(names, fmt.Sprintf("old-%s-%d-%d", mode.name, formers, i))
			}
			// no local tier: every call is a miss, as a new key's is
			h, err := d.Register(fmt.Sprintf("bench-%s-%d", mode.name, formers), WithMode(mode.m),
				WithRetention(2*time.Minute), WithLocalCache(0, 0), WithFormerNames(names...))
			if err != nil {
				b.Fatal(err)
			}
			for _, conc := range []int{1, 64} {
				b.Run(fmt.Sprintf("mode=%s/former=%d/conc=%d", mode.name, formers, conc), func(b *testing.B) {
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
					b.ReportMetric(float64(tc.Trips())/float64(b.N), "trips/op")
				})
			}
		}
	}
}
