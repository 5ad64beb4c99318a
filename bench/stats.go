package main

import (
	"math"
	"slices"
	"sort"
	"time"
)

// median returns the median of xs (the mean of the middle two for an even count),
// or NaN for none. xs is not modified.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// percentile returns the p-th percentile (0 < p ≤ 100) of sorted by nearest rank:
// the smallest sample with at least p% of the samples at or below it. It returns 0
// for no samples.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// ratio returns num/den, or NaN when either is not a finite positive number: a ratio
// of a missing or failed measurement must not look like a figure.
func ratio(num, den float64) float64 {
	if !positive(num) || !positive(den) {
		return math.NaN()
	}
	return num / den
}

// positive reports whether x is finite and above zero.
func positive(x float64) bool { return x > 0 && !math.IsInf(x, 0) && !math.IsNaN(x) }

// latencies holds one worker's per-operation latencies.
type latencies []time.Duration

// merge returns the samples of every worker in one sorted slice.
func merge(ws []latencies) []time.Duration {
	n := 0
	for _, w := range ws {
		n += len(w)
	}
	all := make([]time.Duration, 0, n)
	for _, w := range ws {
		all = append(all, w...)
	}
	slices.Sort(all)
	return all
}
