package embedded_test

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/internal/embedded"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m, nil) }

// skipNoBinary skips the test when err says the server's binary is not on PATH,
// and fails it on any other error.
func skipNoBinary(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, exec.ErrNotFound) {
		testenv.SkipNoServer(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// A spawned server's port is its own; arguments reach it; Stop ends it.
func TestStartRedisServerOwnsItsPortAndTakesArguments(t *testing.T) {
	s, err := embedded.StartRedisServer("", "--maxmemory-policy", "noeviction", "--maxmemory-policy", "allkeys-lru")
	skipNoBinary(t, err)
	defer s.Stop()
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	got, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil || got["maxmemory-policy"] != "allkeys-lru" {
		t.Fatalf("maxmemory-policy %v, %v: want the last argument to win", got, err)
	}
	s.Stop()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("the server still answers after Stop")
	}
}

// A server that cannot start reports why, from its own log.
func TestStartRedisServerReportsWhyItCannotStart(t *testing.T) {
	_, err := embedded.StartRedisServer("", "--no-such-directive", "x")
	if errors.Is(err, exec.ErrNotFound) {
		testenv.SkipNoServer(t, "redis-server is not on PATH")
	}
	if err == nil {
		t.Fatal("no error")
	}
	if !strings.Contains(err.Error(), "FATAL CONFIG FILE ERROR") {
		t.Fatalf("the error does not hold the server's log: %v", err)
	}
	t.Log(err)
}
