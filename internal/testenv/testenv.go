// Package testenv holds what the tests of every package need from real servers: the
// rule for a missing server (skip, or fail under DEDUP_REQUIRE_SERVERS=1), a Redis at
// DEDUP_REDIS_ADDR with keys of the test's own that are deleted afterwards, a
// go-redis hook that counts round trips, a TestMain (Main) with the goroutine leak
// check, a TCP proxy (Proxy) that delays or drops Redis replies mid-command, an
// address that refuses connections (RefusedAddr), one that accepts them and never
// answers (SilentAddr), and a test CA with server and client certificates (PKI). It
// must not import dedup (dedup's own tests use it).
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dedupkit/dedupkit/dedupkittest"
	"github.com/dedupkit/dedupkit/internal/embedded"
)

// Required reports whether a test that would skip for want of a server must fail
// instead: CI sets DEDUP_REQUIRE_SERVERS=1.
func Required() bool { return dedupkittest.RequireServers() }

// SkipNoServer skips the test with the reason, or fails it when Required.
func SkipNoServer(t testing.TB, format string, args ...any) {
	t.Helper()
	dedupkittest.SkipNoServer(t, format, args...)
}

// Prefix returns a key prefix (or name part) no other test or run shares.
func Prefix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "dkt-" + hex.EncodeToString(b[:])
}

// ExternalRedis returns a client for the Redis at DEDUP_REDIS_ADDR, or skips (fails
// when Required). At cleanup it deletes the keys under prefix and closes the client.
func ExternalRedis(t testing.TB, prefix string) *redis.Client {
	t.Helper()
	addr := os.Getenv("DEDUP_REDIS_ADDR")
	if addr == "" {
		SkipNoServer(t, "DEDUP_REDIS_ADDR is not set")
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		SkipNoServer(t, "redis at DEDUP_REDIS_ADDR=%s: %v", addr, err)
	}
	t.Cleanup(func() {
		DeletePrefix(t, c, prefix)
		c.Close()
	})
	return c
}

// DeletePrefix deletes the keys under prefix+":" (embedded.DeleteKeys: SCAN and
// UNLINK, every master of a cluster, never FLUSHDB), logging a failure. It gives up
// after a minute: a benchmark's hundreds of thousands of keys, in a shared server's
// millions, take seconds (5 s left most of them behind, for a day).
func DeletePrefix(t testing.TB, c redis.UniversalClient, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := embedded.DeleteKeys(ctx, c, prefix); err != nil {
		t.Logf("cleanup of %s: %v", prefix, err)
	}
}

// TripCounter is a go-redis hook counting round trips (single commands and
// pipelines) and the commands they carry, leaving out go-redis's own connection
// handshake.
type TripCounter struct {
	trips, cmds atomic.Int64
	mu          sync.Mutex
	names       []string
}

var _ redis.Hook = (*TripCounter)(nil)

// DialHook implements redis.Hook.
func (c *TripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (c *TripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !IsHandshake(cmd) {
			c.count(cmd)
		}
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (c *TripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && !IsHandshake(cmds[0]) {
			c.count(cmds...)
		}
		return next(ctx, cmds)
	}
}

func (c *TripCounter) count(cmds ...redis.Cmder) {
	c.trips.Add(1)
	c.cmds.Add(int64(len(cmds)))
	c.mu.Lock()
	c.names = append(c.names, fmt.Sprintf("%s×%d", cmds[0].Name(), len(cmds)))
	c.mu.Unlock()
}

// Trips returns the round trips counted since the last Reset.
func (c *TripCounter) Trips() int64 { return c.trips.Load() }

// Cmds returns the commands those round trips carried.
func (c *TripCounter) Cmds() int64 { return c.cmds.Load() }

// Reset starts the count again.
func (c *TripCounter) Reset() {
	c.trips.Store(0)
	c.cmds.Store(0)
	c.mu.Lock()
	c.names = nil
	c.mu.Unlock()
}

// String lists the round trips, e.g. "evalsha×10, evalsha×7".
func (c *TripCounter) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.names, ", ")
}

// IsHandshake tells go-redis's own connection set-up (HELLO, CLIENT SETINFO, AUTH,
// SELECT on a new connection) from the commands the code under test sends.
func IsHandshake(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "hello", "client", "auth", "select":
		return true
	}
	return false
}

// quietRedis drops go-redis's own log lines (dial retries in the outage tests).
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// Main is a TestMain for packages whose tests talk to Redis: go-redis's own log
// lines are dropped, the tests run, after (if not nil) cleans up what the package
// started, and a passing run fails if goroutines are left behind (goleak).
func Main(m *testing.M, after func()) {
	redis.SetLogger(quietRedis{})
	code := m.Run()
	if after != nil {
		after()
	}
	stopShared()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
