package dedupkittest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A lease set by PX must end on its own in the embedded Redis, as in a real one:
// dedup's leases rely on it when an owner dies or its release is lost.
func TestStartRedisExpiresKeysOnTheClock(t *testing.T) {
	c := startRedisClient(t)
	ctx := context.Background()
	if err := c.Set(ctx, "lease", "owner", 50*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Exists(ctx, "lease").Result(); err != nil || n != 1 {
		t.Fatalf("just set: exists %d, %v", n, err)
	}
	time.Sleep(150 * time.Millisecond)
	if n, err := c.Exists(ctx, "lease").Result(); err != nil || n != 0 {
		t.Fatalf("150ms after a 50ms PX: exists %d, %v; want the key gone", n, err)
	}
	// SET NX, as a rival's claim, succeeds once the lease has run out
	if ok, err := c.SetNX(ctx, "lease", "rival", time.Second).Result(); err != nil || !ok {
		t.Fatalf("claim after expiry: %v, %v", ok, err)
	}
}

// Close stops the clock goroutine (goleak in TestMain checks) and may be repeated.
func TestRedisCloseMayBeRepeated(t *testing.T) {
	m, err := StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	m.Close()
}

// A key is never more than about one tick early: a 300ms key is still there 200ms on.
func TestStartRedisNeverExpiresAKeyMoreThanATickEarly(t *testing.T) {
	c := startRedisClient(t)
	ctx := context.Background()
	if err := c.Set(ctx, "lease", "owner", 300*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	set := time.Now()
	time.Sleep(200 * time.Millisecond)
	n, err := c.Exists(ctx, "lease").Result()
	if el := time.Since(set); el > 250*time.Millisecond {
		t.Skipf("the check came %v after the SET: too late to tell early from on time", el)
	}
	if err != nil || n != 1 {
		t.Fatalf("200ms into a 300ms PX: exists %d, %v; want the key still there", n, err)
	}
}

// startRedisClient starts an embedded Redis and returns a client of it; both are
// closed at cleanup.
func startRedisClient(t *testing.T) *redis.Client {
	t.Helper()
	m, err := StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { c.Close() })
	return c
}

// The interval between moves follows what moves cost, not one move stretched by a
// stall: a key may go up to one interval early, so a single move that took 90ms (the
// goroutine preempted) must not let a key go most of a second early.
func TestIntervalIgnoresOneStalledMove(t *testing.T) {
	const fast = 50 * time.Microsecond
	for _, c := range []struct {
		took []time.Duration
		want time.Duration
	}{
		{[]time.Duration{fast}, ttlTick},
		{[]time.Duration{fast, fast, 90 * time.Millisecond}, ttlTick},
		{[]time.Duration{fast, 90 * time.Millisecond, 80 * time.Millisecond, fast, fast}, ttlTick},
		// many keys: every move costs 49ms, the interval keeps ticking to a tenth
		{[]time.Duration{49 * time.Millisecond, 52 * time.Millisecond, 49 * time.Millisecond}, 490 * time.Millisecond},
	} {
		if got := interval(c.took); got != c.want {
			t.Errorf("interval(%v) = %v, want %v", c.took, got, c.want)
		}
	}
}
