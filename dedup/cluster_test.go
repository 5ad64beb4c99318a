package dedup

import (
	"errors"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/internal/embedded"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// One spawned 3-master Redis Cluster serves every test in the process that needs a
// cluster; TestMain stops it. It is spawned even when DEDUP_REDIS_ADDR is set (that
// is a plain server), so under DEDUP_REQUIRE_SERVERS=1 the cluster cases never skip
// where redis-server exists.
var sharedCluster struct {
	once  sync.Once
	addrs []string
	stop  func()
	err   error
}

func clusterAddrs(t testing.TB) []string {
	t.Helper()
	sharedCluster.once.Do(func() {
		sharedCluster.addrs, sharedCluster.stop, sharedCluster.err = embedded.StartRedisCluster("", 3)
	})
	if errors.Is(sharedCluster.err, exec.ErrNotFound) {
		testenv.SkipNoServer(t, "redis-server is not on PATH: no Redis Cluster to spawn")
	}
	if sharedCluster.err != nil {
		t.Fatal(sharedCluster.err)
	}
	return sharedCluster.addrs
}

func stopSharedCluster() {
	if sharedCluster.stop != nil {
		sharedCluster.stop()
	}
}

// clusterRedis returns a cluster client over the shared cluster; at cleanup it
// deletes the keys under prefix on every master and closes the client.
func clusterRedis(t testing.TB, prefix string) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: clusterAddrs(t)})
	t.Cleanup(func() {
		testenv.DeletePrefix(t, c, prefix)
		c.Close()
	})
	return c
}

func clusterBackend(t *testing.T) backend {
	prefix := testenv.Prefix()
	c := clusterRedis(t, prefix)
	s, err := NewRedisStore(c)
	if err != nil {
		t.Fatal(err)
	}
	return backend{store: s, prefix: prefix, advance: time.Sleep, rdb: c}
}
