package embedded

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A killed server comes back on the same address with what its AOF held, and Stop
// removes the directory it made.
func TestRestartableRedis(t *testing.T) {
	r, err := StartRestartableRedis("", "--appendonly", "yes", "--appendfsync", "always")
	skipNoRedisServer(t, err)
	defer r.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1})
	defer c.Close()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}

	r.Kill()
	r.Kill() // no-op
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("the server answers after Kill")
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err == nil {
		t.Fatal("Start of a running server: no error")
	}
	if v, err := c.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("after the restart k = %q, %v; want v from the AOF", v, err)
	}
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("after Restart k = %q, %v; want v", v, err)
	}

	dir := r.dir
	r.Stop()
	r.Stop() // idempotent
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("the server answers after Stop")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("directory %s after Stop: %v; want it removed", dir, err)
	}
}
