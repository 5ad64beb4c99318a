package main

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// op is one timed operation of worker w; i counts that worker's operations. It
// returns an error for anything but the expected answer: a measurement that got
// wrong answers is not a measurement.
type op func(ctx context.Context, w, i int) error

// load runs op from c goroutines, each calling it in a loop until d has passed, and
// returns the throughput (operations over the time until the last one finished) and
// the latency percentiles of single operations. The first error stops every worker.
func load(ctx context.Context, c int, d time.Duration, f op) (metrics, error) {
	lat := make([]latencies, c)
	errs := make([]error, c)
	var failed atomic.Bool
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for w := range c {
		wg.Go(func() {
			l := make(latencies, 0, 256)
			for i := 0; !failed.Load(); i++ {
				t0 := time.Now()
				if err := f(ctx, w, i); err != nil {
					errs[w] = err
					failed.Store(true)
					break
				}
				t1 := time.Now()
				l = append(l, t1.Sub(t0))
				if !t1.Before(deadline) {
					break
				}
			}
			lat[w] = l
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	all := merge(lat)
	return metrics{
		mOps: float64(len(all)) / elapsed.Seconds(),
		mP50: float64(percentile(all, 50)),
		mP99: float64(percentile(all, 99)),
	}, nil
}

// keyMaker builds unique keys "<head><worker>-<i>" with one allocation per key.
type keyMaker struct{ head string }

func (k keyMaker) key(w, i int) string {
	var buf [64]byte
	b := append(buf[:0], k.head...)
	b = strconv.AppendInt(b, int64(w), 10)
	b = append(b, '-')
	b = strconv.AppendInt(b, int64(i), 10)
	return string(b)
}
