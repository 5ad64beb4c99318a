package lru

import (
	"errors"
	"fmt"
	"math/bits"
	"time"
)

// ErrInvalidOption is wrapped by every error [New] returns; the wrapping
// message names the setting at fault. Check it with errors.Is.
var ErrInvalidOption = errors.New("lru: invalid option")

// An Option configures a [Cache] built by [New].
type Option func(*config)

// config holds every setting with its default in one place; see newConfig.
type config struct {
	now       func() time.Time
	clockSet  bool
	shards    int
	shardsSet bool
	nilOption bool
}

const (
	// defaultShards bounds the automatic shard count: enough to keep Add's
	// per-shard mutex uncontended on a many-core host, few enough that a
	// small cache still gets a useful CLOCK ring per shard.
	defaultShards = 64
	// minPerShard is the fewest entries the automatic shard count leaves in
	// a shard, so small caches do not degrade into a handful of 1-slot rings.
	minPerShard = 8
	// maxShards caps WithShards so a typo cannot allocate millions of shards.
	maxShards = 1 << 16
)

// WithClock sets the time source for expiry, in place of the monotonic and
// coarse clocks (see the package doc); it is meant for tests. now must be safe
// for concurrent use; nil makes [New] fail with [ErrInvalidOption].
func WithClock(now func() time.Time) Option {
	return func(c *config) {
		c.now = now
		c.clockSet = true
	}
}

// WithShards sets the number of shards, rounded up to a power of two (default
// 64, or fewer so that each holds at least 8 keys). n must be 1 to 65536, else
// [New] fails with [ErrInvalidOption]. Each shard holds at least one key, so
// [Cache.Cap] is at least the shard count; more than size/8 shards make
// eviction less accurate.
func WithShards(n int) Option {
	return func(c *config) {
		c.shards = n
		c.shardsSet = true
	}
}

// newConfig applies opts over the defaults and validates the result.
func newConfig(size int, ttl time.Duration, opts []Option) (config, error) {
	c := config{now: time.Now}
	for _, o := range opts {
		if o == nil {
			c.nilOption = true
			continue
		}
		o(&c)
	}
	switch {
	case size < 1:
		return c, fmt.Errorf("%w: size %d, must be at least 1", ErrInvalidOption, size)
	case ttl <= 0:
		return c, fmt.Errorf("%w: ttl %v, must be positive", ErrInvalidOption, ttl)
	case c.nilOption:
		return c, fmt.Errorf("%w: nil Option", ErrInvalidOption)
	case c.clockSet && c.now == nil:
		return c, fmt.Errorf("%w: WithClock(nil)", ErrInvalidOption)
	case c.shardsSet && (c.shards < 1 || c.shards > maxShards):
		return c, fmt.Errorf("%w: WithShards(%d), must be between 1 and %d", ErrInvalidOption, c.shards, maxShards)
	}
	if c.shardsSet {
		c.shards = ceilPow2(c.shards)
	} else {
		c.shards = min(defaultShards, floorPow2(max(1, size/minPerShard)))
	}
	return c, nil
}

// ceilPow2 returns the least power of two >= n, for 1 <= n <= 1<<62.
func ceilPow2(n int) int {
	if n <= 1 {
		return 1
	}
	return 1 << bits.Len(uint(n-1))
}

// floorPow2 returns the greatest power of two <= n, for n >= 1.
func floorPow2(n int) int {
	return 1 << (bits.Len(uint(n)) - 1)
}
