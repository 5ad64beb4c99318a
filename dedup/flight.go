package dedup

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// flights is the in-process table of keys being claimed or run: concurrent claims of
// one key make one store call, by the first (the leader); the others use its answer.
// Marks do not use it (docs/design.md §4).
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
	ready signal // the leader has the store's answer
	left  signal // the leader is done with the key
	// res, err and running are set before ready fires; fp before the flight is shared
	res Result
	err error
	fp  string
	// running: the leader runs fn; leaseEnd (unix nanos) is when its lease ends, for
	// the RetryAfter of those that wait
	running  bool
	leaseEnd atomic.Int64
	// processed: the leader's fn succeeded (Processed, NotRecorded): callers get Duplicate
	processed atomic.Bool
	// the key's stored reply, when replyKnown: set before ready or processed (never by NotRecorded)
	reply      string
	hasReply   bool
	replyKnown bool
	// since is the handler's forget count when the flight began (Handler.stale)
	since uint64
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

// join returns the flight for key and whether the caller leads it; a new flight
// begins at forget count since.
func (fs *flights) join(key string, since uint64) (*flight, bool) {
	s := fs.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if f, ok := s.m[key]; ok {
		return f, false
	}
	f := &flight{since: since}
	s.m[key] = f
	return f, true
}

// lookup returns key's flight, or nil.
func (fs *flights) lookup(key string) *flight {
	s := fs.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[key]
}

// answer publishes the leader's answer to those waiting.
func (f *flight) answer(res Result, err error, running bool) {
	f.res, f.err, f.running = res, err, running
	f.ready.fire()
}

// knowReply records the key's stored reply, before answer or processed.
func (f *flight) knowReply(reply string, has bool) {
	f.reply, f.hasReply, f.replyKnown = reply, has, true
}

// duplicate answers from the flight of a key known DONE, with its reply for a reply
// form (r; nil otherwise).
func (f *flight) duplicate(r *replyRun) Result {
	r.dup(f.reply, f.hasReply)
	return Result{Outcome: Duplicate, Tier: TierLocal}
}

// leave removes the flight, once the leader is done with the key.
func (fs *flights) leave(key string, f *flight) {
	s := fs.shard(key)
	s.mu.Lock()
	if s.m[key] == f {
		delete(s.m, key)
	}
	s.mu.Unlock()
	f.left.fire()
}

// signal is a broadcast that fires once, like closing a channel; the channel is made
// only when somebody waits before it fires, which most flights never see.
type signal struct{ p atomic.Pointer[chan struct{}] }

// fired is a fired signal's closed channel.
var fired = func() *chan struct{} {
	c := make(chan struct{})
	close(c)
	return &c
}()

// fire releases the waiters, those to come included. A second fire panics: the
// answer would change under waiters that may have read it.
func (s *signal) fire() {
	switch old := s.p.Swap(fired); {
	case old == fired:
		panic("dedup: a flight signal fired twice")
	case old != nil:
		close(*old)
	}
}

// done returns a channel closed once the signal has fired.
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
