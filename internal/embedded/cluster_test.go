package embedded_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

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

// The spawned cluster serves every slot, spreads keys over all its masters, and its
// processes are gone after stop.
func TestStartRedisClusterServesEverySlotAndStopsItsProcesses(t *testing.T) {
	addrs, stop, err := embedded.StartRedisCluster(t.TempDir(), 3)
	skipNoBinary(t, err)
	defer stop()
	if len(addrs) != 3 {
		t.Fatalf("addrs %v, want 3", addrs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs[:1]}) // one seed finds the rest
	defer cc.Close()
	for i := range 300 {
		if err := cc.Set(ctx, fmt.Sprintf("k:%d", i), i, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	perMaster := map[string]int64{}
	if err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		n, err := c.DBSize(ctx).Result()
		mu.Lock()
		perMaster[c.Options().Addr] = n
		mu.Unlock()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if perMaster[a] == 0 {
			t.Errorf("master %s holds no key: %v", a, perMaster)
		}
	}
	for i := range 300 {
		if v, err := cc.Get(ctx, fmt.Sprintf("k:%d", i)).Int(); err != nil || v != i {
			t.Fatalf("k:%d = %d, %v", i, v, err)
		}
	}

	stop()
	stop() // idempotent
	c := redis.NewClient(&redis.Options{Addr: addrs[0], MaxRetries: -1})
	defer c.Close()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("a node still answers after stop")
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
