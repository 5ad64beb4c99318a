package main

import (
	"bytes"
	"context"
	"net"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/internal/embedded"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

func needRedisServer(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		testenv.SkipNoServer(t, "redis-server is not on PATH: no Redis Cluster to spawn")
	}
}

// TestRunClusterSpawned runs the example as `-redis-cluster` alone: it spawns a
// 3-master cluster, runs on it, and stops it at exit.
func TestRunClusterSpawned(t *testing.T) {
	needRedisServer(t)
	out := runExample(t, "-nats=", "-redis-cluster")
	checkSummary(t, out)
	m := regexp.MustCompile(`(?m)^redis: spawned 3-master cluster at (\S+)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatal("the output does not say it spawned a cluster")
	}
	addrs := strings.Split(m[1], ",")
	if len(addrs) != 3 {
		t.Fatalf("cluster addresses %q", m[1])
	}
	for _, a := range addrs {
		if conn, err := net.DialTimeout("tcp", a, time.Second); err == nil {
			conn.Close()
			t.Errorf("the spawned cluster still listens at %s after the run", a)
		}
	}
}

// TestRunClusterSeeds runs it on a cluster of the test's own, given one seed of it,
// and checks that it left no record on any master.
func TestRunClusterSeeds(t *testing.T) {
	needRedisServer(t)
	addrs, stop, err := embedded.StartRedisCluster(t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	out := runExample(t, "-nats=", "-redis-cluster="+addrs[1])
	checkSummary(t, out)
	if !strings.Contains(out, "redis: cluster, seeds "+addrs[1]+"\n") {
		t.Error("the output does not name the seed")
	}

	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var mu sync.Mutex
	var left, masters int
	if err := cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		n, err := node.DBSize(ctx).Result()
		mu.Lock()
		left += int(n)
		masters++
		mu.Unlock()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if masters != 3 || left != 0 {
		t.Errorf("%d records left behind on %d masters", left, masters)
	}
}

func TestClusterFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-redis-cluster", "-redis", "127.0.0.1:6379"},
		{"-redis-cluster=,"},
	} {
		if err := run(context.Background(), args, new(bytes.Buffer)); err == nil {
			t.Errorf("run %q: no error", args)
		}
	}
	for args, want := range map[string][]string{
		"-redis-cluster":          nil,
		"-redis-cluster=a:1, b:2": {"a:1", "b:2"},
		"-redis-cluster=true":     nil,
		"-redis-cluster=a:1":      {"a:1"},
	} {
		cfg, err := parseFlags([]string{args})
		if err != nil || !cfg.cluster.on || !slicesEqual(cfg.cluster.seeds, want) {
			t.Errorf("%s: %+v %v, want seeds %q", args, cfg.cluster, err, want)
		}
	}
	if cfg, err := parseFlags(nil); err != nil || cfg.cluster.on {
		t.Errorf("no flag: cluster %+v, %v", cfg.cluster, err)
	}
}

func slicesEqual(a, b []string) bool {
	return strings.Join(a, "\x00") == strings.Join(b, "\x00") && len(a) == len(b)
}
