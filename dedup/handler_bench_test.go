package dedup

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/dedupkit/dedupkit/dedup/memstore"
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
	newHandler := func(b *testing.B, mem *memstore.Store, local int) *Handler {
		d, _ := New(mem, append([]Option{WithLogger(quiet)}, opts...)...)
		b.Cleanup(func() { d.Close() })
		h, _ := d.Register("bench", WithLocalCache(local, 0))
		return h
	}
	b.Run("tier:local"+suffix, func(b *testing.B) {
		mem, _ := memstore.New()
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
		mem, _ := memstore.New(memstore.WithLimit(1 << 24))
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

// BenchmarkRun measures a batch of fresh keys through the memory store, per
// item: the dedup layer's own cost in the adapter's batch path (HandleBatchParallel,
// as the JetStream adapter calls it), in each mode.
func BenchmarkRun(b *testing.B) {
	ctx := context.Background()
	const n = 64
	payload := []byte(`{"order":"0000000000","sku":"bench-sku","qty":1,"note":"dedupkit"}`)
	for _, mode := range []Mode{ModeFilter, ModeDo} {
		name := map[Mode]string{ModeFilter: "filter", ModeDo: "do"}[mode]
		b.Run(fmt.Sprintf("mode:%s/batch:%d/store:memory", name, n), func(b *testing.B) {
			mem, _ := memstore.New(memstore.WithLimit(1 << 26))
			d, _ := New(mem, WithLogger(quiet))
			b.Cleanup(func() { d.Close() })
			h, _ := d.Register("bench", WithMode(mode))
			items := make([]Item, n)
			seq := 0
			fn := func(context.Context, int) error { return nil }
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += n {
				for j := range items {
					seq++
					items[j] = Item{Key: "m-" + strconv.Itoa(seq), Payload: payload}
				}
				for _, r := range h.Run(ctx, items, fn, Parallel(128)) {
					if r.Err != nil || (r.Outcome != First && r.Outcome != Processed) {
						b.Fatal(r.Outcome, r.Err)
					}
				}
			}
		})
	}
}

// BenchmarkMark measures a filter-mode check answered by the local tier, from
// GOMAXPROCS goroutines: no store call, no allocation, no write to shared state.
func BenchmarkMark(b *testing.B) {
	ctx := context.Background()
	const n = 1 << 14
	mem, _ := memstore.New()
	d, _ := New(mem, WithLogger(quiet))
	b.Cleanup(func() { d.Close() })
	h, _ := d.Register("bench", WithMode(ModeFilter), WithLocalCache(2*n, 0))
	trace := make([]string, n)
	for i := range trace {
		trace[i] = fmt.Sprintf("order-%d", i)
		h.Mark(ctx, trace[i])
	}
	b.Run("tier:local", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				if res, _ := h.Mark(ctx, trace[i&(n-1)]); res.Tier != TierLocal {
					b.Fatal("miss")
				}
				i++
			}
		})
	})
}

// BenchmarkDoReply measures a reply form's duplicate answered by the local tier's
// replies (a lock and a map lookup, no allocation: the reply is shared), and a run
// through the memory store that stores a 1 KiB reply.
func BenchmarkDoReply(b *testing.B) {
	ctx := context.Background()
	const n = 1 << 12
	trace := make([]string, n)
	for i := range trace {
		trace[i] = fmt.Sprintf("order-%d", i)
	}
	reply := make([]byte, 1024)
	fn := func(context.Context) ([]byte, error) { return reply, nil }
	b.Run("tier:local", func(b *testing.B) {
		mem, _ := memstore.New()
		d, _ := New(mem, WithLogger(quiet))
		b.Cleanup(func() { d.Close() })
		h, _ := d.Register("bench", WithReplies(0), WithLocalCache(2*n, 0), WithLocalReplies(8<<20))
		for _, k := range trace {
			runReply(h, ctx, k, nil, fn)
		}
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				if res, _ := runReply(h, ctx, trace[i&(n-1)], nil, fn); res.Tier != TierLocal || len(res.Reply) != len(reply) {
					b.Fatal("miss")
				}
				i++
			}
		})
	})
	b.Run("tier:memory-store", func(b *testing.B) {
		mem, _ := memstore.New(memstore.WithLimit(1 << 24))
		d, _ := New(mem, WithLogger(quiet))
		b.Cleanup(func() { d.Close() })
		h, _ := d.Register("bench", WithReplies(0), WithLocalCache(0, 0))
		b.ReportAllocs()
		b.ResetTimer()
		var seq atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				k := strconv.FormatInt(seq.Add(1), 10)
				if res, _ := runReply(h, ctx, k, nil, fn); res.Outcome != Processed {
					b.Fatal(res.Outcome)
				}
			}
		})
	})
}
