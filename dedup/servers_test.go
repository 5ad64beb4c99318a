package dedup

import (
	"errors"
	"net"
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

// spawnRedis starts a redis-server of our own on a free loopback port with extra
// arguments, and stops it (by its PID) at cleanup.
func spawnRedis(t testing.TB, args ...string) string {
	t.Helper()
	addr, stop, err := startRedis(args...)
	if errors.Is(err, exec.ErrNotFound) {
		testenv.SkipNoServer(t, "redis-server is not on PATH")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return addr
}

// startRedis starts a redis-server (embedded.StartRedisServer) in a temporary
// directory of its own; stop kills it by its PID and removes the directory.
func startRedis(args ...string) (addr string, stop func(), err error) {
	srv, err := embedded.StartRedisServer("", args...)
	if err != nil {
		return "", nil, err
	}
	return srv.Addr, srv.Stop, nil
}

// One spawned redis-server serves every test in the process that needs a plain real
// server and has no DEDUP_REDIS_ADDR; TestMain stops it.
var shared struct {
	once sync.Once
	addr string
	stop func()
	err  error
}

func sharedRedisAddr(t testing.TB) string {
	t.Helper()
	shared.once.Do(func() { shared.addr, shared.stop, shared.err = startRedis() })
	if errors.Is(shared.err, exec.ErrNotFound) {
		testenv.SkipNoServer(t, "redis-server is not on PATH and DEDUP_REDIS_ADDR is not set")
	}
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.addr
}

func stopSharedRedis() {
	if shared.stop != nil {
		shared.stop()
	}
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
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
