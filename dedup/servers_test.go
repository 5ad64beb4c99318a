package dedup

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

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

func startRedis(args ...string) (addr string, stop func(), err error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "dedup-redis-")
	if err != nil {
		return "", nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	argv := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir}, args...)
	cmd := exec.Command(bin, argv...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("start redis-server: %w", err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // drain its log so it never blocks on a full pipe
		defer wg.Done()
		s := bufio.NewScanner(out)
		for s.Scan() {
		}
	}()
	stop = func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		wg.Wait()
		os.RemoveAll(dir)
	}
	addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return addr, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("spawned redis-server on %s did not answer: %w", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
