package dedup

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/dedup/storetest"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// backend is one Store under test, with a way to move its time forward.
type backend struct {
	store   driver.Store
	prefix  string
	advance func(time.Duration)
	// rdb is the Redis client behind a Redis store (nil for memory): the suite checks
	// raw values and TTLs through it.
	rdb redis.UniversalClient
}

type backendFactory struct {
	name string
	new  func(t *testing.T) backend
}

// storeBackends lists every Store the conformance suite runs against. The real
// redis-server comes from DEDUP_REDIS_ADDR or is spawned, the 3-master Redis Cluster
// is spawned; without redis-server they skip (and fail under DEDUP_REQUIRE_SERVERS=1).
func storeBackends() []backendFactory {
	return []backendFactory{
		{"memory", func(t *testing.T) backend {
			clk := storetest.NewClock()
			s, err := memstore.New(memstore.WithClock(clk.Now))
			if err != nil {
				t.Fatal(err)
			}
			return backend{store: s, prefix: testenv.Prefix(), advance: clk.Add}
		}},
		{"miniredis", func(t *testing.T) backend {
			m, c := testenv.Miniredis(t)
			s, err := redisstore.New(c)
			if err != nil {
				t.Fatal(err)
			}
			return backend{store: s, prefix: testenv.Prefix(), advance: m.FastForward, rdb: c}
		}},
		{"redis-server", func(t *testing.T) backend {
			prefix := testenv.Prefix()
			c := testenv.Redis(t, prefix)
			s, err := redisstore.New(c)
			if err != nil {
				t.Fatal(err)
			}
			return backend{store: s, prefix: prefix, advance: time.Sleep, rdb: c}
		}},
		{"redis-cluster", clusterBackend},
	}
}

// Durations are short so that the real server, which can only sleep, stays fast; the
// margins are wide so that a loaded machine does not flake.
const (
	cLease     = time.Second
	cRetention = 3 * time.Second
	cMargin    = 400 * time.Millisecond
)
