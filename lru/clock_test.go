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
	// A stall of two ticks between the read and the check lets the goroutine
	// stop itself already, so read until it is seen running.
	waitFor(t, "reads did not start the goroutine", func() bool { k.read(); return k.running() })
	waitFor(t, "the goroutine still runs with nobody reading", func() bool { return !k.running() })
	if v := k.now.Load(); v != 0 {
		t.Fatalf("stopped clock still holds %d; the next read would use it", v)
	}
	time.Sleep(5 * tickEvery)
	before := monoNow()
	if v := k.read(); v < before {
		t.Fatalf("first read after idling returned %d, older than %d", v, before)
	}
	k.mu.Lock()
	starts := k.starts
	k.mu.Unlock()
	if starts < 2 {
		t.Fatalf("%d goroutines started: the read after idling started none", starts)
	}
}

// While hits keep coming, one goroutine keeps ticking: reads mark the clock
// used, so it is not stopped and started again every tick.
func TestCoarseClockKeepsTicking(t *testing.T) {
	var k coarseClock
	k.acquire()
	defer k.release()
	// gaps counts the reads that may have come a whole tick after the one
	// before (the reader was descheduled): from before the one read to after
	// the next, which bounds the time between them from above.
	gaps := 0
	prev := time.Now() // before the previous read
	for start := prev; time.Since(start) < 100*time.Millisecond; {
		before := time.Now()
		k.read()
		if time.Since(prev) >= tickEvery {
			gaps++
		}
		prev = before
	}
	k.mu.Lock()
	starts := k.starts
	k.mu.Unlock()
	// A restart needs a whole tick without a read: at most one per such gap (and the
	// first start), however loaded the machine, not one every other tick.
	if starts > gaps+1 {
		t.Fatalf("%d goroutines started in 100ms of reads, with %d gaps of a tick between reads", starts, gaps)
	}
	t.Logf("%d starts, %d gaps of a tick", starts, gaps)
}

// A release with a Cache still open leaves the goroutine alone; the last one
// stops it and waits for it; with nothing open, a read starts none.
func TestCoarseClockLastReleaseStopsIt(t *testing.T) {
	var k coarseClock
	k.acquire()
	k.acquire()
	waitFor(t, "reads did not start the goroutine", func() bool { k.read(); return k.running() })
	k.mu.Lock()
	stop, done := k.stop, k.done
	k.mu.Unlock()
	k.release()
	select {
	case <-stop: // only a release closes stop; an idle goroutine just halts
		t.Fatal("a release with a Cache still open stopped the goroutine")
	default:
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

// The last release also waits for a goroutine that halted itself (an unread
// tick) and may still be ending.
func TestCoarseClockReleaseWaitsForAHaltedGoroutine(t *testing.T) {
	for i := range 50 {
		var k coarseClock
		k.acquire()
		k.read()
		waitFor(t, "the goroutine still runs with nobody reading", func() bool { return !k.running() })
		k.mu.Lock()
		done := k.done
		k.mu.Unlock()
		k.release()
		select {
		case <-done:
		default:
			t.Fatalf("try %d: the last release returned while a halted goroutine was still ending", i)
		}
	}
}

// A release racing with a tick leaves the clock halted: a tick that read
// "used" before the release must not store a time after it, or reads would
// get that time for ever, with no goroutine to advance it.
func TestCoarseClockReleaseRacingATickLeavesItHalted(t *testing.T) {
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

// A Cache on the default clock keeps a key for its TTL, judged by a coarse
// clock that never runs ahead; AddFor shortens a key's life however short
// the TTL; closing the last Cache stops the clock's goroutine.
func TestDefaultClockKeepsKeysForTheirTTLAndStopsAtClose(t *testing.T) {
	const ttl = 50 * time.Millisecond
	c, err := New(16, ttl)
	if err != nil {
		t.Fatal(err)
	}
	added := time.Now()
	c.Add("k")
	if !c.Contains("k") && time.Since(added) < ttl {
		t.Fatal("key missing before its TTL")
	}
	waitFor(t, "key still found long after its TTL", func() bool {
		found := c.Contains("k")
		if !found && time.Since(added) < ttl {
			t.Fatalf("key dropped %v after Add, before its TTL", time.Since(added))
		}
		return !found
	})
	c.Add("short")
	c.AddFor("short", 500*time.Microsecond)
	time.Sleep(5 * time.Millisecond)
	if c.Contains("short") {
		t.Fatal("AddFor(500µs) did not shorten a key already held")
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

// A key is not found after its TTL even while the coarse clock is stalled (its
// goroutine held up, as on a saturated machine): near its expiry a hit
// confirms with the monotonic clock. A key far from it is still found.
func TestNoHitAfterTTLWhileTheClockStalls(t *testing.T) {
	const ttl = 30 * time.Millisecond
	c, err := New(16, ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	long, err := New(16, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer long.Close()
	long.Add("far")
	for {
		c.Add("k")
		long.Contains("far") // keeps the goroutine ticking
		coarse.mu.Lock()     // stalls it: tick waits for the mutex
		if coarse.now.Load() != 0 {
			break // ticking, and held up from here on
		}
		coarse.mu.Unlock() // it stopped just now; go again
	}
	defer coarse.mu.Unlock()
	stalled := coarse.now.Load()
	time.Sleep(ttl + 10*time.Millisecond)
	if coarse.now.Load() != stalled {
		t.Fatal("the coarse clock advanced while its mutex was held")
	}
	if c.Contains("k") {
		t.Fatal("key found after its TTL while the coarse clock stalled")
	}
	if !long.Contains("far") {
		t.Fatal("a key an hour from its expiry was not found")
	}
}
