package dedup

import (
	"errors"
	"os"
	"os/exec"
	"sync"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/internal/embedded"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

func newMiniredis(t testing.TB) (*miniredis.Miniredis, *redis.Client) {
	t.Helper()
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { c.Close() })
	return m, c
}

// spawnRedis starts a redis-server of our own (testenv.SpawnRedis) with extra
// arguments, and returns its address.
func spawnRedis(t testing.TB, args ...string) string {
	t.Helper()
	return testenv.SpawnRedis(t, args...).Addr()
}

// One spawned redis-server serves every test in the process that needs a plain real
// server and has no DEDUP_REDIS_ADDR; TestMain stops it.
var shared struct {
	once sync.Once
	srv  *embedded.Proc
	err  error
}

func sharedRedisAddr(t testing.TB) string {
	t.Helper()
	shared.once.Do(func() { shared.srv, shared.err = embedded.StartRedisServer("") })
	if errors.Is(shared.err, exec.ErrNotFound) {
		testenv.SkipNoServer(t, "redis-server is not on PATH and DEDUP_REDIS_ADDR is not set")
	}
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.srv.Addr()
}

func stopSharedRedis() {
	if shared.srv != nil {
		shared.srv.Stop()
	}
}

// realRedis returns a client for the real server the suite should use:
// DEDUP_REDIS_ADDR when set, else a spawned redis-server.
func realRedis(t testing.TB, prefix string) *redis.Client {
	t.Helper()
	if os.Getenv("DEDUP_REDIS_ADDR") != "" {
		return testenv.ExternalRedis(t, prefix)
	}
	c := redis.NewClient(&redis.Options{Addr: sharedRedisAddr(t)})
	t.Cleanup(func() {
		testenv.DeletePrefix(t, c, prefix)
		c.Close()
	})
	return c
}
