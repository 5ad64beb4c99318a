package testenv

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/internal/embedded"
)

// Miniredis starts a miniredis for t and returns it with a client; both stop at
// cleanup.
func Miniredis(t testing.TB) (*miniredis.Miniredis, *redis.Client) {
	t.Helper()
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { c.Close() })
	return m, c
}

// One spawned redis-server and one spawned 3-master Cluster serve every test of a
// process that needs them; Main stops them.
var (
	sharedRedis struct {
		once sync.Once
		srv  *embedded.Proc
		err  error
	}
	sharedCluster struct {
		once  sync.Once
		addrs []string
		stop  func()
		err   error
	}
)

// SharedRedisAddr returns the address of the process's spawned redis-server,
// starting it on first use; without redis-server on PATH it skips t.
func SharedRedisAddr(t testing.TB) string {
	t.Helper()
	sharedRedis.once.Do(func() { sharedRedis.srv, sharedRedis.err = embedded.StartRedisServer("") })
	if errors.Is(sharedRedis.err, exec.ErrNotFound) {
		SkipNoServer(t, "redis-server is not on PATH and DEDUP_REDIS_ADDR is not set")
	}
	if sharedRedis.err != nil {
		t.Fatal(sharedRedis.err)
	}
	return sharedRedis.srv.Addr()
}

// Redis returns a client for a real server: DEDUP_REDIS_ADDR when set, else the
// shared spawned redis-server. At cleanup it deletes the keys under prefix.
func Redis(t testing.TB, prefix string) *redis.Client {
	t.Helper()
	if os.Getenv("DEDUP_REDIS_ADDR") != "" {
		return ExternalRedis(t, prefix)
	}
	c := redis.NewClient(&redis.Options{Addr: SharedRedisAddr(t)})
	t.Cleanup(func() {
		DeletePrefix(t, c, prefix)
		c.Close()
	})
	return c
}

// ClusterAddrs returns the seed addresses of the shared spawned Redis Cluster,
// starting it on first use; without redis-server on PATH it skips t.
func ClusterAddrs(t testing.TB) []string {
	t.Helper()
	sharedCluster.once.Do(func() {
		sharedCluster.addrs, sharedCluster.stop, sharedCluster.err = embedded.StartRedisCluster("", 3)
	})
	if errors.Is(sharedCluster.err, exec.ErrNotFound) {
		SkipNoServer(t, "redis-server is not on PATH: no Redis Cluster to spawn")
	}
	if sharedCluster.err != nil {
		t.Fatal(sharedCluster.err)
	}
	return sharedCluster.addrs
}

// Cluster returns a client of the shared Cluster; at cleanup it deletes the keys
// under prefix on every master and closes the client.
func Cluster(t testing.TB, prefix string) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: ClusterAddrs(t)})
	t.Cleanup(func() {
		DeletePrefix(t, c, prefix)
		c.Close()
	})
	return c
}

func stopShared() {
	if sharedRedis.srv != nil {
		sharedRedis.srv.Stop()
	}
	if sharedCluster.stop != nil {
		sharedCluster.stop()
	}
}

// CountedRedis returns, by name (miniredis, redis-server), makers of a client whose
// round trips and commands a TripCounter counts, with a fresh key prefix.
func CountedRedis() map[string]func(t *testing.T) (*redis.Client, *TripCounter, string) {
	mk := func(c *redis.Client, prefix string) (*redis.Client, *TripCounter, string) {
		tc := &TripCounter{}
		c.AddHook(tc)
		return c, tc, prefix
	}
	return map[string]func(t *testing.T) (*redis.Client, *TripCounter, string){
		"miniredis": func(t *testing.T) (*redis.Client, *TripCounter, string) {
			_, c := Miniredis(t)
			return mk(c, Prefix())
		},
		"redis-server": func(t *testing.T) (*redis.Client, *TripCounter, string) {
			p := Prefix()
			return mk(Redis(t, p), p)
		},
	}
}

// ExpectTrips fails t unless tc counted trips round trips carrying cmds commands.
func ExpectTrips(t *testing.T, what string, tc *TripCounter, trips, cmds int64) {
	t.Helper()
	if tc.Trips() != trips || tc.Cmds() != cmds {
		t.Fatalf("%s: %d round trips carrying %d commands, want %d carrying %d", what, tc.Trips(), tc.Cmds(), trips, cmds)
	}
}

// RedisRaw is direct access to the server under a Redis store, as storetest.Raw.
func RedisRaw(c redis.UniversalClient) rawRedis { return rawRedis{c} }

type rawRedis struct{ c redis.UniversalClient }

func (r rawRedis) Get(ctx context.Context, key string) (string, error) {
	return r.c.Get(ctx, key).Result()
}

func (r rawRedis) Set(ctx context.Context, key, value string, ttl time.Duration) error {
	return r.c.Set(ctx, key, value, ttl).Err()
}

func (r rawRedis) PTTL(ctx context.Context, key string) (time.Duration, error) {
	return r.c.PTTL(ctx, key).Result()
}
