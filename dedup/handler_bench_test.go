package dedup

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
)

// BenchmarkDo measures a check answered by the local tier (a duplicate: no store call,
// no allocation) and one that goes through the memory store (claim, run, complete).
func BenchmarkDo(b *testing.B) {
	ctx := context.Background()
	const n = 1 << 14
	trace := make([]string, n)
	for i := range trace {
		trace[i] = fmt.Sprintf("order-%d", i)
	}
	b.Run("tier:local", func(b *testing.B) {
		mem, _ := NewMemoryStore()
		d, _ := New(mem, WithLogger(quiet))
		defer d.Close()
		h, _ := d.Register("bench", WithLocalCache(2*n, 0)) // room for uneven shards
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
	b.Run("tier:memory-store", func(b *testing.B) {
		mem, _ := NewMemoryStore(WithMemoryLimit(1 << 24))
		d, _ := New(mem, WithLogger(quiet))
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
