package dedup

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// flights is the in-process table of keys being checked or run, so that concurrent
// calls for one key make one store call: the first caller (the leader) asks the store,
// the others wait for its answer, then answer from it without a network call.
type flights struct {
	seed   maphash.Seed
	shards [flightShards]flightShard
}

const flightShards = 32

type flightShard struct {
	mu sync.Mutex
	m  map[string]*flight
}

type flight struct {
	ready signal // fired once the leader has the store's answer
	left  signal // fired once the leader is done with the key
	// set by the leader before ready fires
	res Result
	err error
	fp  string // the leader's fingerprint, set before the flight is shared
	// running is true while the leader runs fn; leaseEnd (unix nanos) is when its lease
	// ends as far as this process knows, for the RetryAfter of those that wait.
	running  bool
	leaseEnd atomic.Int64
	// processed is set by the leader, before it leaves, when its run of fn ended
	// Processed: a call for the key then answers Duplicate
	processed atomic.Bool
	// reply is what the flight knows of the key's stored reply (WithReplies), when
	// replyKnown: set by the leader before ready fires (its claim's answer) or before
	// processed is set (the reply its run stored, or none). A Mark's answer, or the
	// local tier's to a call that is not a reply form, says nothing of it.
	reply      string
	hasReply   bool
	replyKnown bool
	// stale is set when the key was forgotten (or the local tier purged) while the
	// flight was out: its store answer may predate the forget, so the leader must not
	// leave it in the local tier (see Handler.remember).
	stale atomic.Bool
}

func newFlights() *flights {
	f := &flights{seed: maphash.MakeSeed()}
	for i := range f.shards {
		f.shards[i].m = make(map[string]*flight)
	}
	return f
}

func (fs *flights) shard(key string) *flightShard {
	return &fs.shards[maphash.String(fs.seed, key)%flightShards]
}

// join returns the flight for key and whether the caller leads it.
func (fs *flights) join(key string) (*flight, bool) {
	s := fs.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if f, ok := s.m[key]; ok {
		return f, false
	}
	f := new(flight)
	s.m[key] = f
	return f, true
}

// invalidate marks the flight out for key, if any, stale.
func (fs *flights) invalidate(key string) {
	s := fs.shard(key)
	s.mu.Lock()
	if f, ok := s.m[key]; ok {
		f.stale.Store(true)
	}
	s.mu.Unlock()
}

// invalidateAll marks every flight out stale.
func (fs *flights) invalidateAll() {
	for i := range fs.shards {
		s := &fs.shards[i]
		s.mu.Lock()
		for _, f := range s.m {
			f.stale.Store(true)
		}
		s.mu.Unlock()
	}
}

// answer publishes the leader's answer to the waiting callers.
func (f *flight) answer(res Result, err error, running bool) {
	f.res, f.err, f.running = res, err, running
	f.ready.fire()
}

// knowReply records what the leader knows of the key's stored reply; before it
// publishes an answer (answer) or its run's processing (ran, processed).
func (f *flight) knowReply(reply string, has bool) {
	f.reply, f.hasReply, f.replyKnown = reply, has, true
}

// duplicate is the answer a call gets from the flight of a key found or made DONE,
// with what the flight knows of its reply for a reply form (r; nil otherwise).
func (f *flight) duplicate(r *replyRun) Result {
	r.dup(f.reply, f.hasReply)
	return Result{Outcome: Duplicate, Tier: TierLocal}
}

// leave removes the flight; the leader calls it once it is done with the key.
func (fs *flights) leave(key string, f *flight) {
	s := fs.shard(key)
	s.mu.Lock()
	if s.m[key] == f {
		delete(s.m, key)
	}
	s.mu.Unlock()
	f.left.fire()
}

// signal is a broadcast that fires once, as closing a channel does. Its channel is
// made only when somebody waits before it fires: most flights have no waiter, and
// so cost no channel.
type signal struct{ p atomic.Pointer[chan struct{}] }

// fired stands for a signal that has fired: its channel is closed.
var fired = func() *chan struct{} {
	c := make(chan struct{})
	close(c)
	return &c
}()

// fire releases the waiters, those to come included. A second fire panics, as a
// second close of a channel would: the flight's answer would change under waiters
// that may have read it.
func (s *signal) fire() {
	switch old := s.p.Swap(fired); {
	case old == fired:
		panic("dedup: a flight signal fired twice")
	case old != nil:
		close(*old)
	}
}

// done returns a channel that is closed once the signal has fired.
func (s *signal) done() <-chan struct{} {
	if p := s.p.Load(); p != nil {
		return *p
	}
	c := make(chan struct{})
	if s.p.CompareAndSwap(nil, &c) {
		return c
	}
	return *s.p.Load() // another waiter's channel, or fired
}

func (f *flight) retryAfter(lease time.Duration) time.Duration {
	left := time.Duration(f.leaseEnd.Load() - time.Now().UnixNano())
	if left <= 0 || left > lease {
		return lease
	}
	return left
}
