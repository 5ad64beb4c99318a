package dedupkittest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/internal/proc"
)

const clusterSlots = 16384

// StartRedisCluster starts a Redis Cluster of masters redis-server processes (1 to
// 16, no replicas) on free loopback ports, working in dir ("" for a temp dir that stop
// removes), and returns their addresses, each a seed, once the cluster is ok (at most
// 30 s). It needs redis-server 7 or later on PATH; without it the error wraps
// exec.ErrNotFound (see SkipNoServer). On an error nothing it started is left
// running. stop kills the processes by PID and may be called again; on Linux they
// also die with the caller.
func StartRedisCluster(dir string, masters int) (addrs []string, stop func(), err error) {
	if masters < 1 || masters > 16 {
		return nil, nil, fmt.Errorf("dedupkittest: redis cluster: %d masters, want 1..16", masters)
	}
	ownDir := dir == ""
	if ownDir {
		if dir, err = os.MkdirTemp("", "dedup-redis-cluster-"); err != nil {
			return nil, nil, err
		}
	}
	var nodes []*proc.Proc
	var once sync.Once
	stopAll := func() {
		once.Do(func() {
			for _, n := range nodes {
				n.Stop()
			}
			if ownDir {
				_ = os.RemoveAll(dir)
			}
		})
	}
	defer func() {
		if err != nil {
			stopAll()
		}
	}()

	buses := make([]int, masters)
	for i := range masters {
		n, err := startClusterNode(filepath.Join(dir, fmt.Sprintf("node-%d", i)), &buses[i])
		if err != nil {
			return nil, nil, fmt.Errorf("dedupkittest: redis cluster: %w", err)
		}
		nodes = append(nodes, n)
		addrs = append(addrs, n.Addr())
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clients := make([]*redis.Client, masters)
	for i, n := range nodes {
		clients[i] = redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1, DisableIdentity: true})
		defer clients[i].Close()
	}
	for i, c := range clients {
		lo, hi := i*clusterSlots/masters, (i+1)*clusterSlots/masters-1
		// Distinct epochs, as redis-cli --cluster create sets them, so that no
		// collision has to be resolved before the cluster settles.
		if err := c.Do(ctx, "cluster", "set-config-epoch", i+1).Err(); err != nil {
			return nil, nil, fmt.Errorf("dedupkittest: redis cluster: set-config-epoch: %w", err)
		}
		if err := addSlots(ctx, c, lo, hi); err != nil {
			return nil, nil, fmt.Errorf("dedupkittest: redis cluster: addslots on %s: %w", nodes[i].Addr(), err)
		}
	}
	for i := 1; i < masters; i++ {
		if err := clients[0].Do(ctx, "cluster", "meet", "127.0.0.1", nodes[i].Port(), buses[i]).Err(); err != nil {
			return nil, nil, fmt.Errorf("dedupkittest: redis cluster: meet %s: %w", nodes[i].Addr(), err)
		}
	}
	if err := waitClusterOK(ctx, clients); err != nil {
		return nil, nil, err
	}
	return addrs, stopAll, nil
}

// startClusterNode starts one cluster node in dir, with a free bus port (*bus), not
// port+10000, which may be past 65535 or taken.
func startClusterNode(dir string, bus *int) (*proc.Proc, error) {
	return proc.Spawn("redis-server", dir, proc.RedisReady, func(dir string) (int, []string, error) {
		port, err := proc.FreePort()
		if err != nil {
			return 0, nil, err
		}
		if *bus, err = proc.FreePort(); err != nil {
			return 0, nil, err
		}
		return port, append(proc.RedisArgv(port, dir, false),
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(*bus), "--cluster-node-timeout", "3000"), nil
	})
}

// addSlots assigns slots lo..hi to the node: CLUSTER ADDSLOTSRANGE (Redis 7), else
// CLUSTER ADDSLOTS with every slot listed.
func addSlots(ctx context.Context, c *redis.Client, lo, hi int) error {
	err := c.ClusterAddSlotsRange(ctx, lo, hi).Err()
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "unknown subcommand") {
		return err
	}
	slots := make([]int, 0, hi-lo+1)
	for s := lo; s <= hi; s++ {
		slots = append(slots, s)
	}
	return c.ClusterAddSlots(ctx, slots...).Err()
}

// waitClusterOK waits until every node knows every other, sees every slot served,
// and reports cluster_state:ok.
func waitClusterOK(ctx context.Context, clients []*redis.Client) error {
	want := []string{
		"cluster_state:ok",
		"cluster_slots_assigned:" + strconv.Itoa(clusterSlots),
		"cluster_known_nodes:" + strconv.Itoa(len(clients)),
	}
	var last string
	for {
		ok := true
		for _, c := range clients {
			info, err := c.ClusterInfo(ctx).Result()
			if err != nil {
				last, ok = err.Error(), false
				break
			}
			for _, w := range want {
				if !strings.Contains(info, w+"\r\n") {
					last, ok = c.Options().Addr+": no "+w, false
				}
			}
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("dedupkittest: redis cluster: not ok (%s)", last), ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
