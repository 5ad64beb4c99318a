package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/lru"
)

// Scenario a: the local tier, as lru/lru_bench_test.go's BenchmarkHit measures it.
//
// 64Ki message-id-like keys are all present; GOMAXPROCS goroutines (RunParallel)
// look them up in a shuffled order from spread-out offsets. Three variants:
// lru.Cache.Contains (the local tier itself), sync.Map.Load (the baseline), and
// Handler.Mark on a key the local tier holds (what a caller sees: the full path of a
// local duplicate). Mark's handler is on a memstore.Store, which a local hit never
// reaches, so the scenario writes nothing to Redis. A fourth, lru-add, is the insert
// (issue 4 §3: at most 400 ns), as BenchmarkAdd measures it: the same goroutines add
// the 64Ki keys over and over to a cache that holds an eighth of them, each goroutine
// its own share of the keys (every GOMAXPROCS-th), so that an Add never finds a key
// that another goroutine has just added: beyond the first 8Ki of a round, every Add
// inserts a key that is not there and evicts one.

const (
	localKeys = 1 << 16
	localMask = localKeys - 1
	addSize   = localKeys / 8 // lru-add's cache: most of the keys added are absent
)

// Local tier variants.
const (
	varLRU     = "lru-contains"
	varSyncMap = "syncmap-load"
	varMarkHit = "mark-local-hit"
	varLRUAdd  = "lru-add"
)

// localState is what scenario a keeps across rounds.
type localState struct {
	probe []string // the keys, shuffled
	cache *lru.Cache
	smap  sync.Map
	mark  *dedup.Handler
}

func (b *bench) setupLocal(ctx context.Context) error {
	st := &b.local
	keys := make([]string, localKeys)
	rng := rand.New(rand.NewPCG(42, 42))
	seen := make(map[string]bool, localKeys)
	for i := range keys {
		for {
			k := fmt.Sprintf("orders:msg:%016x", rng.Uint64())
			if !seen[k] {
				seen[k], keys[i] = true, k
				break
			}
		}
	}
	var err error
	if st.cache, err = lru.New(2*localKeys, time.Hour); err != nil {
		return err
	}
	b.closers = append(b.closers, func() error { st.cache.Close(); return nil })
	mem, err := memstore.New()
	if err != nil {
		return err
	}
	dd, err := dedup.New(mem)
	if err != nil {
		return err
	}
	b.closers = append(b.closers, dd.Close)
	if st.mark, err = dd.Register("local", dedup.WithMode(dedup.ModeFilter), dedup.WithLocalCache(2*localKeys, time.Hour)); err != nil {
		return err
	}
	for _, k := range keys {
		st.cache.Add(k)
		st.smap.Store(k, struct{}{})
		if res, err := st.mark.Mark(ctx, k); err != nil || res.Outcome != dedup.First {
			return errors.Join(fmt.Errorf("mark while filling the local tier answered %v", res.Outcome), err)
		}
	}
	st.probe = append([]string(nil), keys...)
	rand.New(rand.NewPCG(1, 1)).Shuffle(len(st.probe), func(i, j int) {
		st.probe[i], st.probe[j] = st.probe[j], st.probe[i]
	})
	return nil
}

// addShare is the index of the k-th key lru-add's goroutine number w adds, out of
// procs goroutines: every procs-th key from w on, so that no two goroutines add
// the same key.
func addShare(w, procs, k uint64) uint64 { return (w%procs + k*procs) & localMask }

func (b *bench) roundLocal(ctx context.Context, r int) error {
	st := &b.local
	// lru-add's cache is new each round, so that each round measures the same thing;
	// addWorker numbers its goroutines (testing.Benchmark runs the loop more than
	// once, each time on new goroutines: a residue modulo GOMAXPROCS stays theirs).
	var addWorker atomic.Int64
	addCache, err := lru.New(addSize, time.Hour)
	if err != nil {
		return err
	}
	defer addCache.Close()
	// Each loop calls its lookup directly, as lru's own benchmark does: a call
	// through a func value would add the same few ns to every variant.
	variants := []struct {
		name string
		loop func(pb *testing.PB, i uint64) (misses int64)
	}{
		{varLRU, func(pb *testing.PB, i uint64) (miss int64) {
			for ; pb.Next(); i++ {
				if !st.cache.Contains(st.probe[i&localMask]) {
					miss++
				}
			}
			return miss
		}},
		{varSyncMap, func(pb *testing.PB, i uint64) (miss int64) {
			for ; pb.Next(); i++ {
				if _, ok := st.smap.Load(st.probe[i&localMask]); !ok {
					miss++
				}
			}
			return miss
		}},
		{varMarkHit, func(pb *testing.PB, i uint64) (miss int64) {
			for ; pb.Next(); i++ {
				res, err := st.mark.Mark(ctx, st.probe[i&localMask])
				if err != nil || res.Outcome != dedup.Duplicate || res.Tier != dedup.TierLocal {
					miss++
				}
			}
			return miss
		}},
		{varLRUAdd, func(pb *testing.PB, _ uint64) (miss int64) {
			w, procs := uint64(addWorker.Add(1)-1), uint64(runtime.GOMAXPROCS(0))
			for k := uint64(0); pb.Next(); k++ {
				addCache.Add(st.probe[addShare(w, procs, k)])
			}
			return 0
		}},
	}
	for j := range variants {
		v := variants[(j+r)%len(variants)]
		var seq atomic.Uint64
		var misses atomic.Int64
		res := testing.Benchmark(func(tb *testing.B) {
			tb.ReportAllocs()
			tb.RunParallel(func(pb *testing.PB) {
				misses.Add(v.loop(pb, seq.Add(1)*0x9E3779B9))
			})
		})
		if n := misses.Load(); n > 0 {
			return fmt.Errorf("%s: %d lookups of present keys missed", v.name, n)
		}
		if v.name == varLRUAdd && addCache.Len() > addSize {
			return fmt.Errorf("%s: the cache holds %d keys, more than its size %d", v.name, addCache.Len(), addSize)
		}
		if res.N == 0 {
			return fmt.Errorf("%s: testing.Benchmark ran nothing", v.name)
		}
		b.res.add("local", v.name, 0, r, metrics{
			mNsOp:   float64(res.T.Nanoseconds()) / float64(res.N),
			mAllocs: float64(res.MemAllocs) / float64(res.N),
		})
	}
	return nil
}
