// Package embedded starts the servers that the examples, the bench program and the
// tests use when no real server is given: in process, a NATS server with JetStream
// and miniredis; as child processes (Proc) of binaries on PATH, a redis-server, a
// sentinel, a Redis Cluster, or a nats-server, each signalled by its own PID. It
// must not import testing; internal/testenv wraps it for tests.
package embedded

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/nats-io/nats-server/v2/server"
)

// NATS is an in-process NATS server with JetStream, on a free loopback port.
type NATS struct {
	srv *server.Server
}

// StartNATS starts a NATS server with JetStream storing under dir (a temp dir).
func StartNATS(dir string) (*NATS, error) {
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: true,
		StoreDir:  dir,
		NoLog:     true,
		NoSigs:    true,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("embedded nats: not ready after 10s")
	}
	return &NATS{srv: srv}, nil
}

// URL returns the client URL, nats://127.0.0.1:<port>.
func (n *NATS) URL() string { return n.srv.ClientURL() }

// Close shuts the server down and waits for it.
func (n *NATS) Close() {
	n.srv.Shutdown()
	n.srv.WaitForShutdown()
}

// Redis is miniredis on a free loopback port whose TTLs run on the wall clock, as a
// real Redis's do. Left to itself miniredis never expires a key: a lease whose owner
// died, or whose release was lost, would then hold its key for ever, and every later
// delivery of that message would be InProgress until the broker gave up on it.
type Redis struct {
	*miniredis.Miniredis
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// ttlTick is how often the embedded Redis moves its TTLs on, at least. Each move takes
// the time passed off every key, so a key set just before one goes up to a tick early;
// and a move never takes off more than one interval, so under a starved process keys
// go late rather than early (as in Redis, where expiry is never early).
const ttlTick = 20 * time.Millisecond

// StartRedis starts miniredis and a goroutine that moves its TTLs on by the time
// really passed, until Close. (miniredis's own ClockTTL does the same on every command,
// walking every key each time: too slow for the main job.)
func StartRedis() (*Redis, error) {
	m, err := miniredis.Run()
	if err != nil {
		return nil, err
	}
	r := &Redis{Miniredis: m, stop: make(chan struct{}), done: make(chan struct{})}
	go r.tick()
	return r, nil
}

// tick moves the TTLs on. A move walks and sorts every key under miniredis's lock, so
// the interval grows to ten times what a move takes (interval): with many keys,
// ticking keeps to a tenth of the server, and keys go up to one interval early.
func (r *Redis) tick() {
	defer close(r.done)
	every := ttlTick
	t := time.NewTimer(every)
	defer t.Stop()
	last := time.Now()
	took := []time.Duration{0} // the last moves' times, the latest last; a new server is empty
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

// interval is the time to the next move after moves that took took: ten times the
// least of them, and at least ttlTick. The least, because a move's time also holds
// whatever kept the goroutine from running (the process preempted on a busy
// machine, a GC pause): taken alone, one such move would stretch the interval, and
// so how early a key may go, to ten times a stall (close to a second was seen, which
// ended 300ms leases whose owners were alive and extending them). A real cost, many
// keys, shows in every move.
func interval(took []time.Duration) time.Duration {
	return max(ttlTick, 10*slices.Min(took))
}

// Close stops the clock and the server. It is safe to call more than once.
func (r *Redis) Close() {
	r.once.Do(func() { close(r.stop) })
	<-r.done
	r.Miniredis.Close()
}
