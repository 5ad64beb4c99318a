package dedupkittest

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The spawned cluster serves every slot, spreads keys over all its masters, and its
// processes are gone after stop.
func TestStartRedisClusterServesEverySlotAndStopsItsProcesses(t *testing.T) {
	addrs, stop, err := StartRedisCluster(t.TempDir(), 3)
	if errors.Is(err, exec.ErrNotFound) {
		SkipNoServer(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
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
