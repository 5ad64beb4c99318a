package lru

import (
	"fmt"
	"strings"
	"sync"
	"time"
)

// BytesEntryOverhead is what [Bytes] counts for an entry besides its key and
// value: the entry, its map slot and its string headers, rounded up, so that
// many tiny values are bounded too.
const BytesEntryOverhead = 160

// Bytes is a map from string keys to string values, each kept for a TTL after
// its Add, bounded by bytes: an entry counts len(key) + len(value) +
// [BytesEntryOverhead], and an Add past the budget evicts the least recently
// used entries. It keeps stored replies beside a [Cache] of keys. It is safe
// for concurrent use under one mutex, so it suits lookups that cost far more
// than a lock. Build it with [NewBytes]; the zero value is not usable.
type Bytes struct {
	budget int64
	ttl    int64 // nanoseconds
	base   time.Time
	now    func() time.Time

	mu     sync.Mutex
	m      map[string]*bytesEntry
	head   bytesEntry // sentinel of the recency list: head.next is the most recent
	size   int64
	closed bool
}

type bytesEntry struct {
	key, value string
	expires    int64 // nanoseconds since base
	prev, next *bytesEntry
}

// NewBytes returns an empty Bytes of at most budget bytes, each entry kept for
// ttl after its Add; of the options only [WithClock] applies. budget < 1,
// ttl <= 0, a nil Option, WithClock(nil) or WithShards returns an error
// wrapping [ErrInvalidOption].
func NewBytes(budget int64, ttl time.Duration, opts ...Option) (*Bytes, error) {
	if budget < 1 {
		return nil, fmt.Errorf("%w: budget %d bytes, must be at least 1", ErrInvalidOption, budget)
	}
	cfg, err := newConfig(1, ttl, opts)
	if err != nil {
		return nil, err
	}
	if cfg.shardsSet {
		return nil, fmt.Errorf("%w: WithShards does not apply to Bytes", ErrInvalidOption)
	}
	b := &Bytes{budget: budget, ttl: int64(ttl), now: cfg.now, m: make(map[string]*bytesEntry)}
	b.base = b.now()
	b.head.prev, b.head.next = &b.head, &b.head
	return b, nil
}

func (b *Bytes) clock() int64 { return int64(b.now().Sub(b.base)) }

func entryCost(key, value string) int64 {
	return int64(len(key)) + int64(len(value)) + BytesEntryOverhead
}

// Get returns key's value, if it was added less than its TTL ago and has not
// been removed or evicted since, and marks it as the most recently used.
func (b *Bytes) Get(key string) (value string, ok bool) {
	now := b.clock()
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.m[key]
	if e == nil {
		return "", false
	}
	if now >= e.expires {
		b.unlink(e)
		return "", false
	}
	b.unlinkList(e)
	b.pushFront(e)
	return e.value, true
}

// Add stores value under key for the TTL, replacing key's old value, and evicts
// the least recently used entries until it fits. An entry larger than the whole
// budget is not stored (and key's old value is removed). It copies key, not
// value. After [Bytes.Close] Add does nothing.
func (b *Bytes) Add(key, value string) { b.add(key, value, b.ttl) }

// AddFor is Add with a shorter life, min(ttl, the TTL). ttl <= 0 adds nothing
// and removes key's old value.
func (b *Bytes) AddFor(key, value string, ttl time.Duration) {
	b.add(key, value, min(int64(ttl), b.ttl))
}

func (b *Bytes) add(key, value string, ttl int64) {
	now := b.clock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	if e := b.m[key]; e != nil {
		b.unlink(e)
	}
	cost := entryCost(key, value)
	if ttl <= 0 || cost > b.budget {
		return
	}
	for b.size+cost > b.budget {
		b.unlink(b.head.prev) // the least recently used
	}
	e := &bytesEntry{key: strings.Clone(key), value: value, expires: now + ttl}
	b.m[e.key] = e
	b.pushFront(e)
	b.size += cost
}

// Remove deletes key if present.
func (b *Bytes) Remove(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.m[key]; e != nil {
		b.unlink(e)
	}
}

// RemovePrefix deletes every key that starts with prefix ("" deletes all) and
// returns how many it deleted. It visits every entry under the lock.
func (b *Bytes) RemovePrefix(prefix string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for k, e := range b.m {
		if strings.HasPrefix(k, prefix) {
			b.unlink(e)
			n++
		}
	}
	return n
}

// Len returns the number of entries held, expired ones not yet reclaimed
// included.
func (b *Bytes) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.m)
}

// Size returns the bytes held, as counted against the budget: never more than
// [Bytes.Budget].
func (b *Bytes) Size() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.size
}

// Budget returns the most bytes the map holds.
func (b *Bytes) Budget() int64 { return b.budget }

// Close drops every entry; afterwards Get finds nothing and Add does nothing.
// It is idempotent.
func (b *Bytes) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	clear(b.m)
	b.head.prev, b.head.next = &b.head, &b.head
	b.size = 0
}

// unlink removes e from the map and the list. Called with mu held.
func (b *Bytes) unlink(e *bytesEntry) {
	delete(b.m, e.key)
	b.unlinkList(e)
	b.size -= entryCost(e.key, e.value)
}

func (b *Bytes) unlinkList(e *bytesEntry) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

func (b *Bytes) pushFront(e *bytesEntry) {
	e.prev, e.next = &b.head, b.head.next
	b.head.next.prev = e
	b.head.next = e
}
