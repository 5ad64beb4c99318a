package dedupkittest

import (
	"slices"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// Redis is miniredis on a free loopback port whose TTLs run on the wall clock, as a
// real Redis's do (miniredis alone never expires a key). Its methods are miniredis's.
type Redis struct {
	*miniredis.Miniredis
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// ttlTick is how often the TTLs move on, at least. A key may go up to one interval
// early; under a starved process keys go late rather than early.
const ttlTick = 20 * time.Millisecond

// StartRedis starts miniredis, with a goroutine that moves its TTLs on until Close.
func StartRedis() (*Redis, error) {
	m, err := miniredis.Run()
	if err != nil {
		return nil, err
	}
	r := &Redis{Miniredis: m, stop: make(chan struct{}), done: make(chan struct{})}
	go r.tick()
	return r, nil
}

// tick moves the TTLs on; a move walks every key under a lock, hence interval.
func (r *Redis) tick() {
	defer close(r.done)
	every := ttlTick
	t := time.NewTimer(every)
	defer t.Stop()
	last := time.Now()
	took := []time.Duration{0} // the last moves' times, the latest last
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		if d := min(now.Sub(last), every); d > 0 {
			r.FastForward(d)
		}
		last = now
		took = append(took, time.Since(now))
		if len(took) > movesTimed {
			took = took[1:]
		}
		every = interval(took)
		t.Reset(every)
	}
}

// movesTimed is how many of the last moves interval looks at.
const movesTimed = 5

// interval is ten times the least of the last moves' times, at least ttlTick: one
// move stretched by a stall must not let keys go early.
func interval(took []time.Duration) time.Duration {
	return max(ttlTick, 10*slices.Min(took))
}

// Close stops the clock and the server. It is safe to call more than once.
func (r *Redis) Close() {
	r.once.Do(func() { close(r.stop) })
	<-r.done
	r.Miniredis.Close()
}
