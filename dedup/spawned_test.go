package dedup

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/internal/embedded"
	"github.com/dedupkit/dedupkit/internal/storekit"
)

// Helpers for the tests that run their own redis-server processes (kill, restart,
// pause, replicas, eviction): the reliability tests of issue 5.

// clientOf returns a client for a spawned server, closed at cleanup. Its retries and
// timeouts are go-redis's defaults unless mod changes them.
func clientOf(t *testing.T, p *embedded.Proc, mod ...func(*redis.Options)) *redis.Client {
	t.Helper()
	o := &redis.Options{Addr: p.Addr()}
	for _, m := range mod {
		m(o)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

// recordCounts counts the DONE and IN PROGRESS records under prefix.
func recordCounts(t *testing.T, c *redis.Client, prefix string) (done, inProgress int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		v, err := c.Get(ctx, iter.Val()).Result()
		if err == redis.Nil {
			continue // expired or evicted since the scan saw it
		}
		if err != nil {
			t.Fatal(err)
		}
		switch r, _ := storekit.Parse(v); r.State {
		case storekit.StateDone:
			done++
		case storekit.StateInProgress:
			inProgress++
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return done, inProgress
}

// tally counts fn runs per key, safe for concurrent use.
type tally struct {
	mu   sync.Mutex
	runs map[string]int
}

func newTally() *tally { return &tally{runs: make(map[string]int)} }

func (r *tally) fn(key string) func(context.Context) error {
	return func(context.Context) error {
		r.mu.Lock()
		r.runs[key]++
		r.mu.Unlock()
		return nil
	}
}

func (r *tally) of(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs[key]
}

// twice returns how many keys ran more than once, and how many extra runs that was.
func (r *tally) twice() (keys, extra int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.runs {
		if n > 1 {
			keys++
			extra += n - 1
		}
	}
	return keys, extra
}

// total returns every run counted.
func (r *tally) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, v := range r.runs {
		n += v
	}
	return n
}

// extraRuns returns how many runs, over both tallies, were beyond the first of
// their key: the duplicates.
func extraRuns(a, b *tally, keys []string) int {
	extra := 0
	for _, k := range keys {
		if n := a.of(k) + b.of(k); n > 1 {
			extra += n - 1
		}
	}
	return extra
}
