package redisstore_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/dedup/storetest"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// backends are the servers a Redis store runs the suites on: miniredis (its time
// moved by FastForward), a real redis-server (DEDUP_REDIS_ADDR, else spawned) and a
// spawned 3-master Cluster; without redis-server the last two skip (and fail under
// DEDUP_REQUIRE_SERVERS=1).
var backends = []struct {
	name string
	new  func(t *testing.T) storetest.Backend
}{
	{"miniredis", func(t *testing.T) storetest.Backend {
		m, c := testenv.Miniredis(t)
		clk := storetest.NewClock()
		return storetest.Backend{Store: newStore(t, c), Prefix: testenv.Prefix(), Now: clk.Now, Raw: testenv.RedisRaw(c),
			Advance: func(d time.Duration) { m.FastForward(d); clk.Add(d) }}
	}},
	{"redis-server", func(t *testing.T) storetest.Backend {
		prefix := testenv.Prefix()
		c := testenv.Redis(t, prefix)
		return storetest.Backend{Store: newStore(t, c), Prefix: prefix, Advance: time.Sleep, Raw: testenv.RedisRaw(c)}
	}},
	{"redis-cluster", func(t *testing.T) storetest.Backend {
		prefix := testenv.Prefix()
		c := testenv.Cluster(t, prefix)
		return storetest.Backend{Store: newStore(t, c), Prefix: prefix, Advance: time.Sleep, Raw: testenv.RedisRaw(c)}
	}},
}

func newStore(t *testing.T, c redis.UniversalClient) *redisstore.Store {
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// scriptFirst is b with every Claim sent straight to the claim scripts, and every
// Mark as SET NX PX GET, as a store whose claims and marks keep finding records sends
// them (redisstore.ScriptFirst).
func scriptFirst(b func(t *testing.T) storetest.Backend) func(t *testing.T) storetest.Backend {
	return func(t *testing.T) storetest.Backend {
		be := b(t)
		be.Store = redisstore.ScriptFirst(be.Store.(*redisstore.Store))
		return be
	}
}

func TestTheRedisStorePassesTheConformanceSuite(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			storetest.Run(t, b.new)
		})
	}
	for _, b := range backends[:2] {
		t.Run(b.name+"/script-first", func(t *testing.T) {
			t.Parallel()
			storetest.Run(t, scriptFirst(b.new))
		})
	}
}

func TestTheRedisStoreAgreesWithTheReferenceModel(t *testing.T) {
	for _, b := range backends[:2] {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			storetest.RunModel(t, b.new, storetest.ModelConfig{})
		})
		t.Run(b.name+"/script-first", func(t *testing.T) {
			t.Parallel()
			storetest.RunModel(t, scriptFirst(b.new), storetest.ModelConfig{})
		})
	}
}
