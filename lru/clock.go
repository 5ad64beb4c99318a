package lru

import (
	"sync"
	"sync/atomic"
	"time"
)

// epoch is the zero of every default-clock Cache's times: nanoseconds since
// it, read from the monotonic clock.
var epoch = time.Now()

// monoNow returns nanoseconds since epoch, one monotonic read (time.Since
// skips the wall clock). It is at least 1, so that 0 can mean "no tick".
func monoNow() int64 { return max(1, int64(time.Since(epoch))) }

// tickEvery is how often the coarse clock advances while it is read.
const tickEvery = time.Millisecond

// coarseClock is what a hit reads on the default clock: a time one goroutine
// refreshes every tickEvery, so a hit costs an atomic load, not a monotonic
// read (whose serialising TSC read keeps lookups from overlapping their cache
// misses). It never leads the monotonic clock and lags it by a tick plus
// scheduling delay, hence Cache.expired's confirmation near expiry. A tick
// nobody read stops the goroutine and the next read starts another; the last
// open Cache's Close stops it and waits for it and every earlier one.
type coarseClock struct {
	now  atomic.Int64 // monoNow at the last tick; 0 while no goroutine ticks
	used atomic.Bool  // read since the last tick

	mu   sync.Mutex
	open int           // Caches on this clock, not yet closed
	stop chan struct{} // closed to stop the ticking goroutine; nil while none ticks
	// done is closed when the goroutine started last has ended, which it does
	// only after every earlier one; nil before the first start.
	done   chan struct{}
	starts int // goroutines started, for tests
}

// coarse is the clock of every Cache built without WithClock.
var coarse coarseClock

// read returns the coarse time, starting the goroutine if none runs.
func (k *coarseClock) read() int64 {
	if v := k.now.Load(); v != 0 {
		if !k.used.Load() { // write only when needed: the line stays shared
			k.used.Store(true)
		}
		return v
	}
	return k.start()
}

// start reads the monotonic clock and, while a Cache is open, starts the
// goroutine with that time.
func (k *coarseClock) start() int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := monoNow()
	if k.stop == nil && k.open > 0 {
		prev := k.done // a goroutine that halted itself may still be ending
		k.stop, k.done = make(chan struct{}), make(chan struct{})
		k.starts++
		k.used.Store(true)
		k.now.Store(now)
		go k.run(prev, k.stop, k.done)
	}
	return now
}

// run waits for the previous goroutine (prev) to end, then advances now every
// tick until stop is closed or a tick passes unread.
func (k *coarseClock) run(prev, stop, done chan struct{}) {
	defer close(done)
	if prev != nil {
		<-prev
	}
	t := time.NewTicker(tickEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if !k.tick(stop) {
			return
		}
	}
}

// tick advances now, or halts the clock if nobody read it for a whole tick, and
// reports whether the goroutine given stop should go on. It holds k.mu, so that
// a release that halted the clock meanwhile is not undone.
func (k *coarseClock) tick(stop chan struct{}) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stop != stop { // released meanwhile
		return false
	}
	// Halt only after a whole tick unread: a tick that came early, because
	// the one before it was handled late, is no proof that nobody reads.
	if !k.used.Swap(false) && monoNow()-k.now.Load() >= int64(tickEvery) {
		k.halt()
		return false
	}
	k.now.Store(monoNow())
	return true
}

// halt marks the goroutine stopped, so the next read starts another; done
// stays, for release to wait on. Called with k.mu held.
func (k *coarseClock) halt() {
	k.now.Store(0)
	k.stop = nil
}

// acquire counts a new open Cache.
func (k *coarseClock) acquire() {
	k.mu.Lock()
	k.open++
	k.mu.Unlock()
}

// release counts a Cache closed; the last one stops the goroutine and waits
// for it, and any that halted itself, to end.
func (k *coarseClock) release() {
	k.mu.Lock()
	k.open--
	var done chan struct{}
	if k.open == 0 {
		if k.stop != nil {
			close(k.stop)
			k.halt()
		}
		done = k.done
	}
	k.mu.Unlock()
	if done != nil {
		<-done
	}
}
