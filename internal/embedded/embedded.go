// Package embedded starts the servers that the examples, the bench program and the
// tests use when no real server is given: in process, a NATS server with JetStream
// and miniredis (package dedupkittest, re-exported here); as child processes (Proc)
// of binaries on PATH, a redis-server, a sentinel, a Redis Cluster, or a
// nats-server, each signalled by its own PID. It must not import testing;
// internal/testenv wraps it for tests.
package embedded

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedupkittest"
)

// NATS is dedupkittest.NATS: an in-process NATS server with JetStream.
type NATS = dedupkittest.NATS

// Redis is dedupkittest.Redis: miniredis whose TTLs run on the wall clock.
type Redis = dedupkittest.Redis

// StartNATS is dedupkittest.StartNATS.
func StartNATS(dir string) (*NATS, error) { return dedupkittest.StartNATS(dir) }

// StartRedis is dedupkittest.StartRedis.
func StartRedis() (*Redis, error) { return dedupkittest.StartRedis() }

// DeleteKeys is dedupkittest.DeleteKeys: SCAN and UNLINK under prefix+":", every
// master of a cluster, never FLUSHDB.
func DeleteKeys(ctx context.Context, c redis.UniversalClient, prefix string) error {
	return dedupkittest.DeleteKeys(ctx, c, prefix)
}
