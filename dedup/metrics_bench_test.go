package dedup

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// BenchmarkDoMetrics is BenchmarkDo with metrics on (an SDK MeterProvider with a
// manual reader that is never read): the cost of the instruments on a local hit and
// on a call through the memory store. Compare with BenchmarkDo in the same run.
func BenchmarkDoMetrics(b *testing.B) {
	ctx := context.Background()
	const n = 1 << 14
	trace := make([]string, n)
	for i := range trace {
		trace[i] = fmt.Sprintf("order-%d", i)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() { _ = mp.Shutdown(ctx) })
	b.Run("tier:local;metrics:on", func(b *testing.B) {
		mem, _ := NewMemoryStore()
		d, _ := New(mem, WithLogger(quiet), WithMeterProvider(mp))
		defer d.Close()
		h, _ := d.Register("bench", WithLocalCache(2*n, 0))
		for _, k := range trace {
			h.Do(ctx, k, ok)
		}
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				if res, _ := h.Do(ctx, trace[i&(n-1)], ok); res.Tier != TierLocal {
					b.Fatal("miss")
				}
				i++
			}
		})
	})
	b.Run("tier:memory-store;metrics:on", func(b *testing.B) {
		mem, _ := NewMemoryStore(WithMemoryLimit(1 << 24))
		d, _ := New(mem, WithLogger(quiet), WithMeterProvider(mp))
		defer d.Close()
		h, _ := d.Register("bench", WithLocalCache(0, 0))
		b.ReportAllocs()
		b.ResetTimer()
		var seq atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				k := strconv.FormatInt(seq.Add(1), 10)
				if res, _ := h.Do(ctx, k, ok); res.Outcome != Processed {
					b.Fatal(res.Outcome)
				}
			}
		})
	})
}
