package lru

import (
	"math/rand/v2"
	"testing"
	"time"
)

// running reports whether k's goroutine is ticking.
func (k *coarseClock) running() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.stop != nil
}

// waitFor polls cond for up to a second: the coarse clock's goroutine runs on
// a noisy machine, so tests wait for what it must do rather than time it.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("after 1s: %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// The coarse clock never leads the monotonic clock (a key is never missed
// before its TTL), and it advances while read.
func TestCoarseClockTrailsAndAdvances(t *testing.T) {
	var k coarseClock
	k.acquire()
	defer k.release()
	// Read without pause: a pause of a tick would stop the goroutine, and
	// the next read would restart it with the monotonic time.
	first := k.read()
	prev := first
	for start := time.Now(); prev-first < int64(10*time.Millisecond); {
		if time.Since(start) > time.Second {
			t.Fatalf("the coarse clock advanced %v in 1s of reads", time.Duration(prev-first))
		}
		v := k.read()
		if mono := monoNow(); v > mono {
			t.Fatalf("coarse clock %d leads the monotonic clock %d", v, mono)
		}
		if v < prev {
			t.Fatalf("coarse clock went back from %d to %d", prev, v)
		}
		prev = v
	}
	if lag := monoNow() - k.read(); lag > int64(100*time.Millisecond) {
		t.Errorf("coarse clock lags %v while read", time.Duration(lag))
	}
}

// The goroutine stops after a tick nobody read, and the next read starts it
// again with the monotonic time.
func TestCoarseClockStopsWhenIdleAndRestarts(t *testing.T) {
	var k coarseClock
	k.acquire()
	defer k.release()
	k.read()
	if !k.running() {
		t.Fatal("read did not start the goroutine")
	}
	waitFor(t, "the goroutine still runs with nobody reading", func() bool { return !k.running() })
	if v := k.now.Load(); v != 0 {
		t.Fatalf("stopped clock still holds %d; the next read would use it", v)
	}
	time.Sleep(5 * tickEvery)
	before := monoNow()
	if v := k.read(); v < before {
		t.Fatalf("first read after idling returned %d, older than %d", v, before)
	}
	if !k.running() {
		t.Fatal("read after idling did not restart the goroutine")
	}
}

// The last release stops the goroutine and waits for it; with nothing open,
// a read starts none.
func TestCoarseClockLastReleaseStopsIt(t *testing.T) {
	var k coarseClock
	k.acquire()
	k.acquire()
	k.read()
	done := k.done
	k.release()
	if !k.running() {
		t.Fatal("a release with a Cache still open stopped the goroutine")
	}
	k.release()
	select {
	case <-done:
	default:
		t.Fatal("the last release returned before the goroutine ended")
	}
	if k.running() || k.now.Load() != 0 {
		t.Fatal("the last release left the clock ticking")
	}
	if before := monoNow(); k.read() < before {
		t.Fatal("a read with nothing open returned a stale time")
	}
	if k.running() {
		t.Fatal("a read with nothing open started the goroutine")
	}
}

// A release racing with a tick leaves the clock halted: a tick that read
// "used" before the release must not store a time after it, or reads would
// get that time for ever, with no goroutine to advance it.
func TestCoarseClockReleaseRacingATick(t *testing.T) {
	var k coarseClock
	rng := rand.New(rand.NewPCG(7, 7))
	for i := range 300 {
		k.acquire()
		for range rng.IntN(4) + 1 {
			k.read()
			time.Sleep(time.Duration(rng.IntN(int(2 * tickEvery))))
		}
		k.release()
		if v := k.now.Load(); v != 0 || k.running() {
			t.Fatalf("cycle %d: released clock holds %d, running %v", i, v, k.running())
		}
	}
}

// A Cache on the default clock keeps a key for its TTL less a tick, judged
// by a coarse clock that never runs ahead; a TTL of a tick keeps nothing;
// closing the last Cache stops the clock's goroutine.
func TestDefaultClockExpiryAndClose(t *testing.T) {
	const ttl = 50 * time.Millisecond
	c, err := New(16, ttl)
	if err != nil {
		t.Fatal(err)
	}
	added := time.Now()
	c.Add("k")
	if !c.Contains("k") && time.Since(added) < ttl-tickEvery {
		t.Fatal("key missing before its TTL")
	}
	waitFor(t, "key still found long after its TTL", func() bool {
		found := c.Contains("k")
		if !found && time.Since(added) < ttl-tickEvery {
			t.Fatalf("key dropped %v after Add, before its TTL less a tick", time.Since(added))
		}
		return !found
	})
	c.AddFor("short", tickEvery)
	if c.Contains("short") {
		t.Fatal("a key added for one tick was found: the coarse clock could let it outlive that")
	}
	c.Close()
	c.Close() // idempotent: counts once
	coarse.mu.Lock()
	open, stopped := coarse.open, coarse.stop == nil
	coarse.mu.Unlock()
	if open < 0 {
		t.Fatalf("%d open Caches after Close twice", open)
	}
	if open == 0 && !stopped {
		t.Fatal("closing the last Cache left the clock goroutine running")
	}
}
