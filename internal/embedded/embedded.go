// Package embedded starts the servers that the examples, the bench program and the
// tests use when no real server is given: in process, a NATS server with JetStream
// and miniredis (package dedupkittest, re-exported here); as child processes (Proc,
// from internal/proc) of binaries on PATH, a redis-server, a sentinel, or a
// nats-server, each signalled by its own PID, and a Redis Cluster of redis-server
// processes (dedupkittest's, re-exported). It must not import testing;
// internal/testenv wraps it for tests.
package embedded

import (
	"context"
	"os/exec"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedupkittest"
	"github.com/dedupkit/dedupkit/internal/proc"
)

// NATS is dedupkittest.NATS: an in-process NATS server with JetStream.
type NATS = dedupkittest.NATS

// Redis is dedupkittest.Redis: miniredis whose TTLs run on the wall clock.
type Redis = dedupkittest.Redis

// Proc is proc.Proc: a server process spawned from a binary on PATH.
type Proc = proc.Proc

// StartNATS is dedupkittest.StartNATS.
func StartNATS(dir string) (*NATS, error) { return dedupkittest.StartNATS(dir) }

// StartRedis is dedupkittest.StartRedis.
func StartRedis() (*Redis, error) { return dedupkittest.StartRedis() }

// StartRedisCluster is dedupkittest.StartRedisCluster: masters redis-server
// processes forming a Redis Cluster.
func StartRedisCluster(dir string, masters int) (addrs []string, stop func(), err error) {
	return dedupkittest.StartRedisCluster(dir, masters)
}

// DeleteKeys is dedupkittest.DeleteKeys: SCAN and UNLINK under prefix+":", every
// master of a cluster, never FLUSHDB.
func DeleteKeys(ctx context.Context, c redis.UniversalClient, prefix string) error {
	return dedupkittest.DeleteKeys(ctx, c, prefix)
}

// DieWithParent is proc.DieWithParent: on Linux the kernel kills cmd's process
// should this process die first.
func DieWithParent(cmd *exec.Cmd) { proc.DieWithParent(cmd) }
