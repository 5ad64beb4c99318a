package dedup

import (
	"sync"
	"sync/atomic"
)

type counters struct {
	outcomes        [numOutcomes]atomic.Uint64
	local           atomic.Uint64
	store           atomic.Uint64
	database        atomic.Uint64
	unguarded       atomic.Uint64
	leaseLost       atomic.Uint64
	repliesTooLarge atomic.Uint64
	repliesMissing  atomic.Uint64
	// localHits is striped, a cache line each, so that the hottest path writes no
	// line other cores write; Stats adds it to outcomes[Duplicate] and local.
	localHits [localStripes]stripe
	pins      sync.Pool     // *stripe: the one this P used last (a random one hit
	nextPin   atomic.Uint32 // a stripe the other core wrote last half the time)
}

const localStripes = 16

type stripe struct {
	n atomic.Uint64
	_ [56]byte // the rest of a 64-byte cache line
}

// countLocalHit counts a local-tier Duplicate on the stripe of the caller's P.
func (h *Handler) countLocalHit() Result {
	s, _ := h.stats.pins.Get().(*stripe)
	if s == nil { // the P's first, or the pool emptied by a GC
		s = &h.stats.localHits[h.stats.nextPin.Add(1)%localStripes]
	}
	s.n.Add(1)
	h.stats.pins.Put(s)
	return Result{Outcome: Duplicate, Tier: TierLocal}
}

func (h *Handler) count(res Result) Result {
	h.stats.outcomes[res.Outcome].Add(1)
	if res.Outcome == Duplicate { // an InProgress's tier is where the run was seen
		switch res.Tier {
		case TierLocal:
			h.stats.local.Add(1)
		case TierStore:
			h.stats.store.Add(1)
		case TierDatabase:
			h.stats.database.Add(1)
		}
	}
	if res.Unguarded {
		h.stats.unguarded.Add(1)
	}
	return res
}

// Stats is a snapshot of a handler's counters since Register.
type Stats struct {
	outcomes           [numOutcomes]uint64
	LocalDuplicates    uint64 // Duplicates answered in process (TierLocal)
	StoreDuplicates    uint64 // Duplicates answered by the store (TierStore)
	DatabaseDuplicates uint64 // Duplicates answered by a transactional marker (TierDatabase)
	Unguarded          uint64 // fn runs without dedup
	HeartbeatLeaseLost uint64 // heartbeats that found the lease gone
	RepliesTooLarge    uint64 // replies over the WithReplies limit, not stored
	RepliesMissing     uint64 // reply-form Duplicates whose record holds no reply
}

// Count returns how many calls ended with outcome o.
func (s Stats) Count(o Outcome) uint64 {
	if int(o) >= len(s.outcomes) {
		return 0
	}
	return s.outcomes[o]
}

// Stats returns the handler's counters.
func (h *Handler) Stats() Stats {
	if h == nil {
		return Stats{}
	}
	c := &h.stats
	s := Stats{LocalDuplicates: c.local.Load(), StoreDuplicates: c.store.Load(), DatabaseDuplicates: c.database.Load(),
		Unguarded: c.unguarded.Load(), HeartbeatLeaseLost: c.leaseLost.Load(),
		RepliesTooLarge: c.repliesTooLarge.Load(), RepliesMissing: c.repliesMissing.Load()}
	for i := range s.outcomes {
		s.outcomes[i] = c.outcomes[i].Load()
	}
	for i := range c.localHits {
		n := c.localHits[i].n.Load()
		s.outcomes[Duplicate] += n
		s.LocalDuplicates += n
	}
	return s
}
