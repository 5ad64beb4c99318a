package dedup

import (
	"math/rand/v2"
	"sync/atomic"
)

type counters struct {
	outcomes  [numOutcomes]atomic.Uint64
	local     atomic.Uint64
	store     atomic.Uint64
	database  atomic.Uint64
	unguarded atomic.Uint64
	leaseLost atomic.Uint64
	// stored replies (WithReplies)
	repliesTooLarge atomic.Uint64
	repliesMissing  atomic.Uint64
	// localHits counts the Duplicates the local tier answered (countLocalHit), on
	// stripes a cache line each: the hottest path writes no line that other cores
	// write too. Stats adds them to outcomes[Duplicate] and local.
	localHits [localStripes]stripe
}

const localStripes = 16

type stripe struct {
	n atomic.Uint64
	_ [56]byte // the rest of a 64-byte cache line
}

// countLocalHit counts a Duplicate answered by the local tier and returns it. The
// stripe is picked at random: math/rand/v2's global source is per thread, so the
// pick costs no shared write either.
func (h *Handler) countLocalHit() Result {
	h.stats.localHits[rand.Uint32()%localStripes].n.Add(1)
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
	outcomes [numOutcomes]uint64
	// LocalDuplicates counts duplicates answered in process (local tier or a
	// concurrent call), with no store call.
	LocalDuplicates uint64
	// StoreDuplicates counts duplicates answered by the store.
	StoreDuplicates uint64
	// DatabaseDuplicates counts duplicates answered by a transactional run's marker.
	DatabaseDuplicates uint64
	// Unguarded counts fn runs without dedup (fail-open, or a processed missing key).
	Unguarded uint64
	// HeartbeatLeaseLost counts heartbeats that found the lease gone.
	HeartbeatLeaseLost uint64
	// RepliesTooLarge counts fn replies larger than the handler's WithReplies limit:
	// processed, and not stored (ErrReplyTooLarge).
	RepliesTooLarge uint64
	// RepliesMissing counts the Duplicates of reply forms answered without a reply:
	// their DONE record holds none (see ItemResult.HasReply).
	RepliesMissing uint64
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
	var s Stats
	for i := range s.outcomes {
		s.outcomes[i] = h.stats.outcomes[i].Load()
	}
	s.LocalDuplicates = h.stats.local.Load()
	for i := range h.stats.localHits {
		n := h.stats.localHits[i].n.Load()
		s.outcomes[Duplicate] += n
		s.LocalDuplicates += n
	}
	s.StoreDuplicates = h.stats.store.Load()
	s.DatabaseDuplicates = h.stats.database.Load()
	s.Unguarded = h.stats.unguarded.Load()
	s.HeartbeatLeaseLost = h.stats.leaseLost.Load()
	s.RepliesTooLarge = h.stats.repliesTooLarge.Load()
	s.RepliesMissing = h.stats.repliesMissing.Load()
	return s
}
