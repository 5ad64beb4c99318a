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
func BenchmarkDo(b *testing.B) { benchDo(b, "") }

// benchDo runs BenchmarkDo's two cases on Dedupers built with opts; suffix ends each
// case's name (";metrics:on").
func benchDo(b *testing.B, suffix string, opts ...Option) {
	ctx := context.Background()
	const n = 1 << 14
	trace := make([]string, n)
	for i := range trace {
		trace[i] = fmt.Sprintf("order-%d", i)
	}
	newHandler := func(b *testing.B, mem *MemoryStore, local int) *Handler {
		d, _ := New(mem, append([]Option{WithLogger(quiet)}, opts...)...)
		b.Cleanup(func() { d.Close() })
		h, _ := d.Register("bench", WithLocalCache(local, 0))
		return h
	}
	b.Run("tier:local"+suffix, func(b *testing.B) {
		mem, _ := NewMemoryStore()
		h := newHandler(b, mem, 2*n) // room for uneven shards
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
	b.Run("tier:memory-store"+suffix, func(b *testing.B) {
		mem, _ := NewMemoryStore(WithMemoryLimit(1 << 24))
		h := newHandler(b, mem, 0)
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
