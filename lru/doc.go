// Package lru is dedupkit's local tier: [Cache], a bounded, timed set of the
// keys of messages this process knows are processed, so that a redelivered
// message is answered Duplicate with no network call and no allocation; and
// [Bytes], a byte-bounded map of stored replies beside it.
//
// Add a key only once it is known DONE: after a successful Complete, a Mark, or
// a Duplicate answer from the shared store. A key merely IN PROGRESS must not
// enter, or a failed handler's retry would be dropped as a duplicate. Keep the
// TTL within the store's retention, so the cache never claims a key the store
// has forgotten.
//
// A Cache holds at most [Cache.Cap] keys, split over shards that each evict on
// their own with CLOCK (second chance), an approximation of LRU that keeps a hit
// read-only. Each key held costs about 100 bytes (keys up to 39 bytes are stored
// inline; longer ones add their length), allocated as the cache fills. Expiry
// is lazy: an expired key reads as absent, and [Cache.Len] counts it until a
// later Add reclaims its slot.
//
// [Cache.Contains] takes no lock and allocates nothing. By default it reads a
// coarse clock instead of the monotonic one, whose read costs more than the rest
// of a hit: one goroutine advances it every millisecond while caches are hit,
// and it never runs ahead. In a key's last ten seconds a hit confirms with the
// monotonic clock, so a key is found after its TTL only if the coarse clock
// fell over ten seconds behind, which takes the whole process standing still.
// The last open Cache's [Cache.Close] stops the goroutine. [WithClock] replaces
// both clocks with an exact one.
package lru
