// Package lru is the local tier of dedupkit: a bounded, timed set of the
// keys of messages this process knows are processed, so that a redelivered
// message is answered Duplicate with no network call and no allocation.
//
// # What it holds
//
// Only keys known DONE: add a key after a successful Complete, a Mark, or a
// Duplicate answer from the shared store. Never add a key that is merely IN
// PROGRESS; a failed handler must leave no trace here, or its retry would be
// dropped as a duplicate. The TTL should not exceed the shared store's
// retention, so this tier never claims a key the store has forgotten.
//
// # Bounds and expiry
//
// A [Cache] holds at most [Cache.Cap] keys: size rounded up to shards ×
// ceil(size/shards). Each shard evicts on its own, so a shard may evict while
// another has room. Memory is about 100 bytes per key held (keys up to 39
// bytes are stored inline; longer keys add their length), allocated as the
// cache fills.
//
// Expiry is lazy: a key older than the TTL reads as absent and its slot is
// reclaimed by a later Add, so [Cache.Len] may count expired keys.
//
// # The clock
//
// A monotonic clock read costs more than the rest of a hit: it is a vDSO
// call whose serialising TSC read stops the processor from overlapping one
// lookup's cache misses with the next. So by default a hit reads a coarse
// clock instead: one atomic load of a time that a single goroutine, shared
// by all Caches, advances every millisecond. It never runs ahead, and lags
// by a tick plus that goroutine's scheduling delay (tens of milliseconds
// were seen on a saturated 2-core machine), so in a key's last ten seconds
// by the coarse clock a hit confirms with the monotonic clock: a key is not
// found after its TTL unless the coarse clock fell more than ten seconds
// behind, which takes the whole process standing still. Add and eviction
// read the monotonic clock itself. The goroutine runs only while Caches are
// hit: a tick with no hit stops it, the next hit starts it again, and the
// last open Cache's [Cache.Close] stops it and waits for it. [WithClock]
// replaces both clocks with an exact one.
//
// # Eviction
//
// Each shard runs CLOCK (second chance), an approximation of LRU that lets
// a hit stay read-only: Contains sets a reference bit, and Add's hand, when
// the shard is full, evicts the first key that is expired or unreferenced,
// clearing reference bits as it passes. Contains takes no lock: it probes a
// Swiss-table-style index (one cache line of tags and pointers) and reads
// one cache-line node. Add and Remove take the shard's mutex. A read lock
// per shard over a Go map, the obvious alternative (impl:rwmutexmap in
// BenchmarkHit), measured 33–39 and 27–28 ns on the shuffled and
// insertion-order hits against this package's 16–25 and 10–12 ns (three
// runs on a quieter host than the table below): it makes two atomic
// read-modify-writes on a lock word per hit, where Contains makes none.
//
// # Why not golang-lru's expirable.LRU
//
// hashicorp/golang-lru/v2/expirable (v2.0.7) is a fine general cache, but as
// this tier: every Get takes one exclusive mutex and moves a list element,
// so hits serialize across cores; its Contains ignores expiry; each cache
// starts a goroutine that can never be stopped; and it stores a value this
// set does not need. Measured with 2 goroutines on 2 cores (RunParallel,
// 64Ki keys, go test -bench=. -benchmem -count=3 ./lru, medians):
//
//	benchmark                          dedupkit   sync.Map   expirable
//	Hit, shuffled order (ns/op)            41.3       64.7       495
//	Hit, insertion order (ns/op)           14.0       28.0       179
//	Add, evicting, size 8192 (ns/op)        113      81 (*)       362
//	Contains+Add on miss, Zipf 1.1 (ns/op)   88          -       280
//	  hit ratio at size 16384             0.790          -     0.784
//
// The Add row is from a later run (2026-11-24, medians of three), after
// BenchmarkAdd gave each goroutine its own share of the keys: walking from
// offsets, one goroutine re-added keys the other had just added, cheap
// refreshes that had put this package at 184 ns.
//
// (*) sync.Map Store neither bounds nor evicts; 64 mutex-guarded maps take
// 38 ns. A hit allocates nothing in any of them, and sync.Map is here only
// as the floor for a concurrent read. Reading the monotonic clock on every
// hit, as this package did before the coarse clock, measured 86 ns against
// sync.Map's 73 on the shuffled hits.
package lru
