package lru

import (
	"math"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"
)

// inlineKey is the longest key stored inside its node. It makes the node
// exactly 64 bytes, a size class whose objects are cache-line aligned, so a
// hit reads one line of node and no separate key allocation.
const inlineKey = 39

// longKey in node.n marks a key kept in node.long.
const longKey = 255

// node is one key as readers see it. They reach it without a lock, so its
// key never changes after publication; a key evicted and added again gets a
// new node. The hash lives in the writer's ring, not here, to keep the node
// to one cache line.
type node struct {
	expires atomic.Int64  // nanoseconds since Cache.base; gone = math.MinInt64
	ref     atomic.Uint32 // CLOCK reference bit, set by Contains
	pos     int32         // index in shard.ring; used under shard.mu only
	long    *string       // the key, when longer than inlineKey
	n       uint8         // key length, or longKey
	short   [inlineKey]byte
}

func newNode(key string, exp int64, pos int32) *node {
	n := &node{pos: pos}
	if len(key) > inlineKey {
		k := strings.Clone(key)
		n.long, n.n = &k, longKey
	} else {
		n.n = uint8(copy(n.short[:], key))
	}
	n.expires.Store(exp)
	return n
}

// is reports whether n holds key.
func (n *node) is(key string) bool {
	if len(key) > inlineKey {
		return n.long != nil && *n.long == key
	}
	return int(n.n) == len(key) && string(n.short[:len(key)]) == key
}

// hasPrefix reports whether n's key starts with prefix.
func (n *node) hasPrefix(prefix string) bool {
	if n.n == longKey {
		return strings.HasPrefix(*n.long, prefix)
	}
	return len(prefix) <= int(n.n) && string(n.short[:len(prefix)]) == prefix
}

// gone marks a node removed or evicted, so a reader still holding it (from a
// table replaced while it probed) reads it as absent.
const gone = math.MinInt64

// table is one shard's hash index from key to node: open addressing over
// groups of seven buckets, probed group by group (linear probing). A group
// is one cache line: a control word of seven one-byte tags and the seven
// node pointers, so a hit usually costs one line of index and one line of
// node. Readers probe with atomic loads and no lock; the shard's writer
// changes groups in place, and publishes a new table to grow or to drop
// tombstones. The writer stores a pointer before its tag, and readers
// confirm a tag match with node.is, so a torn pair is only a miss. A reader
// still on a replaced table may miss a key added since, but never returns
// one removed since: unlink marks the node gone.
type table struct {
	mask   uint64 // len(groups)-1
	groups []group
}

const groupSize = 7

type group struct {
	ctrl  atomic.Uint64 // byte i is bucket i's tag; byte 7 is unused
	nodes [groupSize]atomic.Pointer[node]
}

const (
	tagEmpty   = 0 // never used since the group was last full: ends a probe
	tagDeleted = 1 // tombstone in a group that has been full
	lsb        = 0x0101010101010101
	msb        = 0x0080808080808080 // high bit of bytes 0-6
)

// tagOf takes bits that neither the shard index (top bits) nor the group
// index (low bits) use.
func tagOf(h uint64) uint64 { return max(2, h>>40&0xff) }

// matchTag has the high bit set in each byte of ctrl equal to tag, and
// possibly in a byte just above one (a borrow); find checks every match.
func matchTag(ctrl, tag uint64) uint64 {
	x := ctrl ^ tag*lsb
	return (x - lsb) &^ x & msb
}

// hasEmpty reports whether a byte of ctrl is tagEmpty. The borrow false
// positive needs a true empty byte below, so the answer is exact.
func hasEmpty(ctrl uint64) bool { return (ctrl-lsb)&^ctrl&msb != 0 }

func newTable(groups int) *table {
	return &table{mask: uint64(groups - 1), groups: make([]group, groups)}
}

// find returns the node for key, or nil. A probe ends at a group with an
// empty bucket, and the writer keeps a quarter of buckets empty; it is also
// bounded by the table size.
func (t *table) find(h uint64, key string) *node {
	tag := tagOf(h)
	for i, j := h&t.mask, uint64(0); j <= t.mask; i, j = (i+1)&t.mask, j+1 {
		g := &t.groups[i]
		ctrl := g.ctrl.Load()
		for m := matchTag(ctrl, tag); m != 0; m &= m - 1 {
			if n := g.nodes[bits.TrailingZeros64(m)/8].Load(); n != nil && n.is(key) {
				return n
			}
		}
		if hasEmpty(ctrl) {
			return nil
		}
	}
	return nil
}

// setTag is for the writer only: the read-modify-write is not atomic.
func (g *group) setTag(b int, tag uint64) {
	sh := b * 8
	g.ctrl.Store(g.ctrl.Load()&^(0xff<<sh) | tag<<sh)
}

// shard is one independently locked part of the cache: the writer's state.
// Its table pointer lives in Cache.tables, so that readers touch a few
// dense cache lines that Adds do not write to.
type shard struct {
	table  *atomic.Pointer[table] // &Cache.tables[i], which holds nil after Close
	mu     sync.Mutex
	ring   []entry // CLOCK ring, grown on demand up to the shard's capacity
	free   []int32 // ring positions emptied by Remove
	hand   int     // next ring position the CLOCK hand inspects
	live   int     // nodes in ring
	used   int     // buckets not empty: live nodes plus tombstones
	maxGrp int     // most groups: buckets at least twice the capacity
	closed bool
	_      [24]byte // to a multiple of 64 bytes; see TestNodesAndGroupsFillOneCacheLineEach
}

// entry is a ring position: a node (nil when free) and its key's hash.
type entry struct {
	n *node
	h uint64
}

func (s *shard) init(table *atomic.Pointer[table], perCap int) {
	s.table = table
	s.maxGrp = ceilPow2((2*perCap + groupSize - 1) / groupSize)
	s.table.Store(newTable(1))
}

// add inserts key or refreshes it; see Cache.Add. Called with s.mu held.
func (s *shard) add(h uint64, key string, now, exp int64, perCap int) {
	if s.closed {
		return
	}
	t := s.table.Load()
	if n := t.find(h, key); n != nil {
		n.expires.Store(exp)
		if n.ref.Load() == 0 {
			n.ref.Store(1)
		}
		return
	}
	n := newNode(key, exp, s.slot(now, perCap))
	// Keep a quarter of the buckets empty so probes stay short and end.
	if (s.used+1)*4 > len(t.groups)*groupSize*3 {
		t = s.rebuild()
	}
	s.insert(t, n, h)
	s.ring[n.pos] = entry{n, h}
	s.live++
}

// slot returns a ring position for a new node: a freed one, a never used
// one, or the victim of the CLOCK hand. Called with s.mu held.
func (s *shard) slot(now int64, perCap int) int32 {
	if k := len(s.free); k > 0 {
		p := s.free[k-1]
		s.free = s.free[:k-1]
		return p
	}
	if len(s.ring) < perCap {
		if len(s.ring) == cap(s.ring) {
			grown := make([]entry, len(s.ring), min(perCap, max(8, 2*cap(s.ring))))
			copy(grown, s.ring)
			s.ring = grown
		}
		s.ring = append(s.ring, entry{})
		return int32(len(s.ring) - 1)
	}
	// Readers may set reference bits behind the hand, so after two turns
	// take whatever is under it rather than sweep forever.
	for turns := 0; ; turns++ {
		p := s.hand
		e := s.ring[p]
		if s.hand++; s.hand == len(s.ring) {
			s.hand = 0
		}
		if n := e.n; n.expires.Load() <= now || n.ref.Load() == 0 || turns >= 2*len(s.ring) {
			s.unlink(n, e.h)
			return int32(p)
		}
		e.n.ref.Store(0)
	}
}

// insert puts n in the first empty or tombstone bucket of its probe chain.
func (s *shard) insert(t *table, n *node, h uint64) {
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		g := &t.groups[i]
		ctrl := g.ctrl.Load()
		for b := range groupSize {
			switch ctrl >> (b * 8) & 0xff {
			case tagEmpty:
				s.used++
			case tagDeleted:
			default:
				continue
			}
			g.nodes[b].Store(n)
			g.setTag(b, tagOf(h))
			return
		}
	}
}

// unlink removes n from the table, leaving its ring position to the caller,
// and marks it gone for readers that still hold it. A group with an empty
// bucket has never been full, so no probe ran past it and the bucket can
// be empty again rather than a tombstone.
func (s *shard) unlink(n *node, h uint64) {
	t := s.table.Load()
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		g := &t.groups[i]
		for b := range groupSize {
			if g.nodes[b].Load() != n {
				continue
			}
			if hasEmpty(g.ctrl.Load()) {
				g.setTag(b, tagEmpty)
				s.used--
			} else {
				g.setTag(b, tagDeleted)
			}
			g.nodes[b].Store(nil)
			n.expires.Store(gone)
			s.live--
			return
		}
	}
}

// rebuild publishes a new table holding the nodes in the ring (except a
// victim just unlinked) and no tombstones, doubling it (up to maxGrp) while
// they and one more would fill over half of it. Readers still probing the
// old table see it unchanged from then on.
func (s *shard) rebuild() *table {
	groups := len(s.table.Load().groups)
	for groups < s.maxGrp && (s.live+1)*2 > groups*groupSize {
		groups *= 2
	}
	t := newTable(groups)
	s.used = 0
	for _, e := range s.ring {
		if e.n != nil && e.n.expires.Load() != gone {
			s.insert(t, e.n, e.h)
		}
	}
	s.table.Store(t)
	return t
}

// remove deletes key if present. Called with s.mu held.
func (s *shard) remove(h uint64, key string) {
	if s.closed {
		return
	}
	if n := s.table.Load().find(h, key); n != nil {
		s.unlink(n, h)
		s.ring[n.pos] = entry{}
		s.free = append(s.free, n.pos)
	}
}

// removePrefix deletes every key starting with prefix and returns how many.
// Called with s.mu held.
func (s *shard) removePrefix(prefix string) int {
	if s.closed {
		return 0
	}
	n := 0
	for p, e := range s.ring {
		if e.n == nil || !e.n.hasPrefix(prefix) {
			continue
		}
		s.unlink(e.n, e.h)
		s.ring[p] = entry{}
		s.free = append(s.free, int32(p))
		n++
	}
	return n
}

// close drops everything the shard holds. Called with s.mu held.
func (s *shard) close() {
	s.closed = true
	s.table.Store(nil)
	s.ring, s.free = nil, nil
	s.live, s.used = 0, 0
}
