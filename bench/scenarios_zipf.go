package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"

	"github.com/dedupkit/dedupkit/dedup"
)

// Scenario c: a duplicate-heavy mix. Keys are drawn from a Zipf distribution over
// zipfUniverse keys, so a few keys come back again and again, as redeliveries and
// republished messages do. zipfConc goroutines walk one pre-drawn trace from
// spread-out offsets; dedup in filter mode with a local tier of zipfLocalSize keys
// is compared with the naive SetNX. Each round uses new keys and a new handler, so
// every round starts cold.

const (
	zipfUniverse  = 1 << 20
	zipfTraceLen  = 1 << 20
	zipfS         = 1.1
	zipfConc      = 64
	zipfLocalSize = 1 << 14
)

// zipfState is what scenario c keeps across rounds.
type zipfState struct {
	trace []uint32 // key numbers, Zipf-distributed
}

func (b *bench) setupZipf(context.Context) error {
	rng := rand.New(rand.NewPCG(7, 7))
	z := rand.NewZipf(rng, zipfS, 1, zipfUniverse-1)
	b.zipf.trace = make([]uint32, zipfTraceLen)
	for i := range b.zipf.trace {
		b.zipf.trace[i] = uint32(z.Uint64())
	}
	return nil
}

// zipfCount is one worker's tally, padded to its own cache line.
type zipfCount struct {
	ops, local, dup int64
	_               [40]byte
}

func (b *bench) roundZipf(ctx context.Context, r int) error {
	h, err := b.dd.Register(fmt.Sprintf("zipf-r%d", r), dedup.WithMode(dedup.ModeFilter),
		dedup.WithRetention(retention), dedup.WithLocalCache(zipfLocalSize, retention))
	if err != nil {
		return err
	}
	head := fmt.Sprintf("z%d-", r)
	naiveHead := b.prefix + ":znaive:"
	key := func(w, i int) string {
		n := b.zipf.trace[(uint64(w+1)*0x9E3779B9+uint64(i))&(zipfTraceLen-1)]
		return head + strconv.FormatUint(uint64(n), 10)
	}
	variants := []struct {
		name string
		op   func(counts []zipfCount) op
	}{
		{varFilter, func(counts []zipfCount) op {
			return func(ctx context.Context, w, i int) error {
				res, err := h.Mark(ctx, key(w, i))
				if err != nil {
					return err
				}
				c := &counts[w]
				c.ops++
				switch res.Outcome {
				case dedup.First:
				case dedup.Duplicate, dedup.InProgress: // a concurrent Mark of the key
					c.dup++
					if res.Tier == dedup.TierLocal {
						c.local++
					}
				default:
					return fmt.Errorf("mark answered %v", res.Outcome)
				}
				return nil
			}
		}},
		{varNaive, func(counts []zipfCount) op {
			return func(ctx context.Context, w, i int) error {
				ok, err := b.plainRDB.SetNX(ctx, naiveHead+key(w, i), 1, retention).Result()
				if err != nil {
					return err
				}
				counts[w].ops++
				if !ok {
					counts[w].dup++
				}
				return nil
			}
		}},
	}
	for j := range variants {
		v := variants[(j+r)%len(variants)]
		counts := make([]zipfCount, zipfConc)
		meter := b.startCPU(ctx)
		m, err := load(ctx, zipfConc, b.cfg.duration, v.op(counts))
		if err != nil {
			return fmt.Errorf("%s: %w", v.name, err)
		}
		meter.stop(ctx).addTo(m)
		var sum zipfCount
		for _, c := range counts {
			sum.ops += c.ops
			sum.local += c.local
			sum.dup += c.dup
		}
		m[mDupRatio] = float64(sum.dup) / float64(sum.ops)
		if v.name == varFilter {
			m[mLocalHit] = float64(sum.local) / float64(sum.ops)
		}
		if err := b.record(ctx, "zipf", v.name, zipfConc, r, m); err != nil {
			return err
		}
	}
	return nil
}
