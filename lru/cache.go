package lru

import (
	"hash/maphash"
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// Cache is a bounded set of string keys, each kept for a TTL after its last
// [Cache.Add]. It is safe for concurrent use. Build it with [New]; the zero
// value is not usable.
type Cache struct {
	seed   maphash.Seed
	shift  uint                    // shard index = hash >> shift: the top bits pick the shard
	ttl    int64                   // nanoseconds
	perCap int                     // keys per shard
	base   time.Time               // the zero of times, with WithClock
	now    func() time.Time        // WithClock's; nil: monoNow and coarse
	tables []atomic.Pointer[table] // per shard; all Contains reads of the Cache
	shards []shard
	closed atomic.Bool
}

// New returns a cache of [Cache.Cap] keys (size rounded up to a multiple of the
// shard count), each kept for ttl after its last Add. size < 1, ttl <= 0, a nil
// Option or an invalid option returns an error wrapping [ErrInvalidOption].
func New(size int, ttl time.Duration, opts ...Option) (*Cache, error) {
	cfg, err := newConfig(size, ttl, opts)
	if err != nil {
		return nil, err
	}
	c := &Cache{
		seed:   maphash.MakeSeed(),
		shift:  uint(64 - bits.TrailingZeros(uint(cfg.shards))),
		ttl:    int64(ttl),
		perCap: (size + cfg.shards - 1) / cfg.shards,
		base:   cfg.now(),
		tables: make([]atomic.Pointer[table], cfg.shards),
		shards: make([]shard, cfg.shards),
	}
	if cfg.clockSet {
		c.now = cfg.now
	} else {
		coarse.acquire()
	}
	for i := range c.shards {
		c.shards[i].init(&c.tables[i], c.perCap)
	}
	return c, nil
}

// clock returns the time for Add: nanoseconds since epoch (a monotonic
// read), or since c.base on WithClock's clock.
func (c *Cache) clock() int64 {
	if c.now == nil {
		return monoNow()
	}
	return int64(c.now().Sub(c.base))
}

// hitClock returns the time for Contains: on the default clock the coarse
// one, which may lag clock() but never leads it.
func (c *Cache) hitClock() int64 {
	if c.now == nil {
		return coarse.read()
	}
	return c.clock()
}

// nearExpiry is how close to its expiry, by the coarse clock, a key must be
// for Contains to confirm with the monotonic clock: more than the coarse
// clock can lag unless the whole process stops (a paused VM, SIGSTOP).
const nearExpiry = int64(10 * time.Second)

// expired reports whether a key that expires at exp has expired. On the
// default clock a hit reads the coarse clock only, unless the key is within
// nearExpiry of its end by it; then the monotonic clock decides.
func (c *Cache) expired(exp int64) bool {
	now := c.hitClock()
	if now >= exp {
		return true
	}
	return c.now == nil && exp-now < nearExpiry && monoNow() >= exp
}

func (c *Cache) shard(h uint64) *shard {
	return &c.shards[h>>c.shift]
}

// Contains reports whether key was added less than the TTL ago and not removed
// or evicted since; a hit marks it recently used. It takes no lock and
// allocates nothing. By default a hit reads a coarse clock (see the package doc).
func (c *Cache) Contains(key string) bool {
	h := maphash.String(c.seed, key)
	t := c.tables[h>>c.shift].Load()
	if t == nil { // closed
		return false
	}
	n := t.find(h, key)
	if n == nil || c.expired(n.expires.Load()) {
		return false
	}
	if n.ref.Load() == 0 { // write only when needed: hot keys stay read-shared
		n.ref.Store(1)
	}
	return true
}

// Add inserts key, or refreshes its expiry to now+TTL. When the key's shard is
// full it evicts an expired key, else the first key not used since the CLOCK
// hand last passed it. The cache keeps its own copy of key. After [Cache.Close]
// Add does nothing.
func (c *Cache) Add(key string) { c.add(key, c.ttl) }

// AddFor is Add with a shorter life, min(ttl, the cache's TTL), for a key whose
// store record expires sooner. ttl <= 0 adds nothing.
func (c *Cache) AddFor(key string, ttl time.Duration) {
	if ttl > 0 {
		c.add(key, min(int64(ttl), c.ttl))
	}
}

func (c *Cache) add(key string, ttl int64) {
	h := maphash.String(c.seed, key)
	s := c.shard(h)
	now := c.clock()
	exp := int64(math.MaxInt64)
	if now < math.MaxInt64-ttl {
		exp = now + ttl
	}
	s.mu.Lock()
	s.add(h, key, now, exp, c.perCap)
	s.mu.Unlock()
}

// Remove deletes key if present; its slot is reused by the next Add to the
// same shard.
func (c *Cache) Remove(key string) {
	h := maphash.String(c.seed, key)
	s := c.shard(h)
	s.mu.Lock()
	s.remove(h, key)
	s.mu.Unlock()
}

// RemovePrefix deletes every key that starts with prefix ("" deletes all) and
// returns how many it deleted. It visits every key, one shard at a time under
// the shard's lock (Contains never waits), so use it for rare invalidations. A
// key added while it runs may stay.
func (c *Cache) RemovePrefix(prefix string) int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += s.removePrefix(prefix)
		s.mu.Unlock()
	}
	return n
}

// Len returns the number of keys held. Expiry is lazy, so this includes
// expired keys not yet reclaimed by an Add; Len never exceeds [Cache.Cap].
// It is 0 after [Cache.Close].
func (c *Cache) Len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += s.live
		s.mu.Unlock()
	}
	return n
}

// Cap returns the most keys the cache holds: the size given to [New] rounded
// up to a multiple of the shard count. Close leaves it unchanged.
func (c *Cache) Cap() int {
	return c.perCap * len(c.shards)
}

// Close releases the cache's memory: afterwards Contains reports false, Add and
// Remove do nothing and Len is 0. It is idempotent. The last open Cache's Close
// stops the coarse clock's goroutine and waits for it.
func (c *Cache) Close() {
	if c.closed.CompareAndSwap(false, true) && c.now == nil {
		defer coarse.release()
	}
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		s.close()
		s.mu.Unlock()
	}
}
