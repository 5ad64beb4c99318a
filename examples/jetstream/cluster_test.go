package main

import (
	"context"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedupkittest"
)

// On a Redis Cluster named by one seed node, the job runs the same and leaves no
// record on any master.
func TestJobRunsOnARedisClusterFromOneSeed(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		dedupkittest.SkipNoServer(t, "redis-server is not on PATH: no Redis Cluster to spawn")
	}
	addrs, stop, err := dedupkittest.StartRedisCluster(t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	checkJob(t, "-nats=", "-redis-cluster="+addrs[1])

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
