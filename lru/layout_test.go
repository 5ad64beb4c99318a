package lru

import (
	"testing"
	"unsafe"
)

// The hit path's cost rests on these sizes: a node and a group each fill
// exactly one cache line, and shards do not share lines.
func TestNodesAndGroupsFillOneCacheLineEach(t *testing.T) {
	if s := unsafe.Sizeof(node{}); s != 64 {
		t.Errorf("node is %d bytes, want 64", s)
	}
	if s := unsafe.Sizeof(group{}); s != 64 {
		t.Errorf("group is %d bytes, want 64", s)
	}
	if s := unsafe.Sizeof(shard{}); s%64 != 0 {
		t.Errorf("shard is %d bytes, want a multiple of 64", s)
	}
}
