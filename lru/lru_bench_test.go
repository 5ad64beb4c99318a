package lru_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/lru"
	"github.com/hashicorp/golang-lru/v2/expirable"
)

// traceLen keys are generated before each timed loop; goroutines walk the
// trace from spread-out offsets.
const (
	traceLen  = 1 << 16
	traceMask = traceLen - 1
	benchTTL  = time.Hour
)

// keyTrace returns n distinct message-ID-like keys.
func keyTrace(n int) []string {
	rng := rand.New(rand.NewPCG(42, 42))
	keys := make([]string, n)
	seen := make(map[string]bool, n)
	for i := range keys {
		for {
			k := fmt.Sprintf("orders:msg:%016x", rng.Uint64())
			if !seen[k] {
				seen[k] = true
				keys[i] = k
				break
			}
		}
	}
	return keys
}

// start returns a per-goroutine starting offset into a trace.
func start(seq *atomic.Uint64) uint64 { return seq.Add(1) * 0x9E3779B9 }

// stride gives a goroutine of RunParallel its own share of a trace: it starts
// at its number and steps by GOMAXPROCS, so no goroutine adds a key another
// has just added (walking from offsets, a faster goroutine laps the other and
// re-adds what it just added, a cheap refresh instead of an insert).
func stride(seq *atomic.Uint64) (first, step uint64) {
	return seq.Add(1) - 1, uint64(runtime.GOMAXPROCS(0))
}

// shardedMap is the simplest bounded-by-nothing baseline for Add: 64 mutex
// maps picked by a cheap hash.
type shardedMap struct {
	shards [64]struct {
		sync.Mutex
		m map[string]struct{}
		_ [40]byte
	}
}

func newShardedMap() *shardedMap {
	s := &shardedMap{}
	for i := range s.shards {
		s.shards[i].m = make(map[string]struct{})
	}
	return s
}

func fnv(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * 1099511628211
	}
	return h
}

func (s *shardedMap) Add(k string) {
	sh := &s.shards[fnv(k)&63]
	sh.Lock()
	sh.m[k] = struct{}{}
	sh.Unlock()
}

// rwShardedMap is the obvious alternative to the lock-free index for hits: 64
// Go maps, each under a read-write lock, picked by a cheap hash.
type rwShardedMap struct {
	shards [64]struct {
		sync.RWMutex
		m map[string]struct{}
		_ [32]byte
	}
}

func newRWShardedMap() *rwShardedMap {
	s := &rwShardedMap{}
	for i := range s.shards {
		s.shards[i].m = make(map[string]struct{})
	}
	return s
}

func (s *rwShardedMap) Add(k string) {
	sh := &s.shards[fnv(k)&63]
	sh.Lock()
	sh.m[k] = struct{}{}
	sh.Unlock()
}

func (s *rwShardedMap) Contains(k string) bool {
	sh := &s.shards[fnv(k)&63]
	sh.RLock()
	_, ok := sh.m[k]
	sh.RUnlock()
	return ok
}

// BenchmarkHit measures Contains (sync.Map Load, expirable Get) on keys all
// present: 64Ki keys, each cache sized to hold them all. By default lookups
// come in a shuffled order; with order:insert they come in the order the keys
// were added, which lets every implementation stream its entries from memory
// in allocation order and so flatters all of them.
func BenchmarkHit(b *testing.B) {
	keys := keyTrace(traceLen)
	shuffled := append([]string(nil), keys...)
	rand.New(rand.NewPCG(1, 1)).Shuffle(len(shuffled), func(i, j int) {
		shuffled[i], shuffled[j] = shuffled[j], shuffled[i]
	})
	orders := []struct {
		name  string
		probe []string
	}{{"", shuffled}, {";order:insert", keys}}
	check := func(b *testing.B, misses *atomic.Int64) {
		if n := misses.Load(); n > 0 {
			b.Fatalf("%d misses in a hit benchmark", n)
		}
	}
	for _, o := range orders {
		probe := o.probe
		b.Run("impl:dedupkit"+o.name, func(b *testing.B) {
			c, err := lru.New(2*traceLen, benchTTL)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			for _, k := range keys {
				c.Add(k)
			}
			var seq atomic.Uint64
			var misses atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i, miss := start(&seq), int64(0)
				for pb.Next() {
					if !c.Contains(probe[i&traceMask]) {
						miss++
					}
					i++
				}
				misses.Add(miss)
			})
			check(b, &misses)
		})
		b.Run("impl:syncmap"+o.name, func(b *testing.B) {
			var m sync.Map
			for _, k := range keys {
				m.Store(k, struct{}{})
			}
			var seq atomic.Uint64
			var misses atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i, miss := start(&seq), int64(0)
				for pb.Next() {
					if _, ok := m.Load(probe[i&traceMask]); !ok {
						miss++
					}
					i++
				}
				misses.Add(miss)
			})
			check(b, &misses)
		})
		b.Run("impl:rwmutexmap;shards:64"+o.name, func(b *testing.B) {
			m := newRWShardedMap()
			for _, k := range keys {
				m.Add(k)
			}
			var seq atomic.Uint64
			var misses atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i, miss := start(&seq), int64(0)
				for pb.Next() {
					if !m.Contains(probe[i&traceMask]) {
						miss++
					}
					i++
				}
				misses.Add(miss)
			})
			check(b, &misses)
		})
		b.Run("impl:golang-lru-expirable"+o.name, func(b *testing.B) {
			c := expirable.NewLRU[string, struct{}](traceLen, nil, benchTTL)
			for _, k := range keys {
				c.Add(k, struct{}{})
			}
			var seq atomic.Uint64
			var misses atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i, miss := start(&seq), int64(0)
				for pb.Next() {
					if _, ok := c.Get(probe[i&traceMask]); !ok {
						miss++
					}
					i++
				}
				misses.Add(miss)
			})
			check(b, &misses)
		})
	}
}

// BenchmarkAdd measures Add of keys not present: the bounded caches hold
// 8Ki of the 64Ki-key trace, and each goroutine adds its own share of the
// keys (stride), so every Add evicts. The unbounded baselines
// (sync.Map Store, 64 mutex maps) insert on the first pass and overwrite
// after, which is cheaper than what the caches do.
func BenchmarkAdd(b *testing.B) {
	const size = 1 << 13
	keys := keyTrace(traceLen)
	b.Run(fmt.Sprintf("impl:dedupkit;size:%d", size), func(b *testing.B) {
		c, err := lru.New(size, benchTTL)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		var seq atomic.Uint64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for i, step := stride(&seq); pb.Next(); i += step {
				c.Add(keys[i&traceMask])
			}
		})
	})
	b.Run("impl:syncmap", func(b *testing.B) {
		var m sync.Map
		var seq atomic.Uint64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for i, step := stride(&seq); pb.Next(); i += step {
				m.Store(keys[i&traceMask], struct{}{})
			}
		})
	})
	b.Run("impl:mutexmap;shards:64", func(b *testing.B) {
		m := newShardedMap()
		var seq atomic.Uint64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for i, step := stride(&seq); pb.Next(); i += step {
				m.Add(keys[i&traceMask])
			}
		})
	})
	b.Run(fmt.Sprintf("impl:golang-lru-expirable;size:%d", size), func(b *testing.B) {
		c := expirable.NewLRU[string, struct{}](size, nil, benchTTL)
		var seq atomic.Uint64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for i, step := stride(&seq); pb.Next(); i += step {
				c.Add(keys[i&traceMask], struct{}{})
			}
		})
	})
}

// BenchmarkMixed runs the dedup pattern, Contains then Add on a miss, over
// a Zipf-distributed trace of 1Mi draws from 1Mi keys, with the cache warmed
// by one pass. It reports the share of Contains that hit.
func BenchmarkMixed(b *testing.B) {
	const (
		size     = 1 << 14
		universe = 1 << 20
		zipfS    = 1.1
	)
	rng := rand.New(rand.NewPCG(7, 7))
	zipf := rand.NewZipf(rng, zipfS, 1, universe-1)
	names := map[uint64]string{}
	trace := make([]string, 1<<20)
	for i := range trace {
		r := zipf.Uint64()
		k, ok := names[r]
		if !ok {
			k = fmt.Sprintf("orders:msg:%016x", rng.Uint64())
			names[r] = k
		}
		trace[i] = k
	}
	mask := uint64(len(trace) - 1)
	type set interface {
		Contains(string) bool
		Add(string)
	}
	run := func(b *testing.B, c set) {
		for _, k := range trace {
			if !c.Contains(k) {
				c.Add(k)
			}
		}
		var seq atomic.Uint64
		var hits, ops atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			var h, n int64
			for i := start(&seq); pb.Next(); i++ {
				k := trace[i&mask]
				if c.Contains(k) {
					h++
				} else {
					c.Add(k)
				}
				n++
			}
			hits.Add(h)
			ops.Add(n)
		})
		b.ReportMetric(float64(hits.Load())/float64(ops.Load()), "hit-ratio")
	}
	name := func(impl string) string {
		return fmt.Sprintf("impl:%s;size:%d;zipf-s:%v", impl, size, zipfS)
	}
	b.Run(name("dedupkit"), func(b *testing.B) {
		c, err := lru.New(size, benchTTL)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		run(b, c)
	})
	b.Run(name("golang-lru-expirable"), func(b *testing.B) {
		run(b, expirableSet{expirable.NewLRU[string, struct{}](size, nil, benchTTL)})
	})
}

type expirableSet struct {
	*expirable.LRU[string, struct{}]
}

func (e expirableSet) Contains(k string) bool { _, ok := e.Get(k); return ok }
func (e expirableSet) Add(k string)           { e.LRU.Add(k, struct{}{}) }

// BenchmarkRemovePrefix is the cost of one RemovePrefix that matches no key (so
// the cache stays full): a visit of every key held, by cache size. dedup pays it
// once per forget notice on a handler with fingerprints.
func BenchmarkRemovePrefix(b *testing.B) {
	for _, size := range []int{10_000, 1 << 20} {
		b.Run(fmt.Sprintf("size:%d", size), func(b *testing.B) {
			c, err := lru.New(size, benchTTL)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			for _, k := range keyTrace(size) {
				c.Add(k)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				c.RemovePrefix("none#")
			}
			b.ReportMetric(float64(c.Len()), "keys")
		})
	}
}
