package lru_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/lru"
)

func newBytes(t *testing.T, budget int64, ttl time.Duration, opts ...lru.Option) *lru.Bytes {
	t.Helper()
	b, err := lru.NewBytes(budget, ttl, opts...)
	if err != nil {
		t.Fatalf("NewBytes(%d, %v): %v", budget, ttl, err)
	}
	t.Cleanup(b.Close)
	return b
}

// cost is what an entry counts against the budget.
func cost(k, v string) int64 { return int64(len(k)+len(v)) + lru.BytesEntryOverhead }

func TestNewBytesRefusesInvalidSettings(t *testing.T) {
	for _, tt := range []struct {
		name   string
		budget int64
		ttl    time.Duration
		opts   []lru.Option
	}{
		{"budget zero", 0, time.Minute, nil},
		{"ttl zero", 100, 0, nil},
		{"shards", 100, time.Minute, []lru.Option{lru.WithShards(4)}},
		{"nil clock", 100, time.Minute, []lru.Option{lru.WithClock(nil)}},
		{"nil option", 100, time.Minute, []lru.Option{nil}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if b, err := lru.NewBytes(tt.budget, tt.ttl, tt.opts...); !errors.Is(err, lru.ErrInvalidOption) || b != nil {
				t.Fatalf("NewBytes: %v %v, want ErrInvalidOption", b, err)
			}
		})
	}
}

// The budget counts bytes, not entries: many small values fit where one large one
// evicts them, the least recently used first, and the size never passes the budget.
func TestBytesBudgetCountsBytesNotEntries(t *testing.T) {
	small := strings.Repeat("s", 100)
	budget := 4 * cost("k0", small)
	b := newBytes(t, budget, time.Hour)
	for i := range 4 {
		b.Add(fmt.Sprintf("k%d", i), small)
	}
	if b.Len() != 4 || b.Size() != budget {
		t.Fatalf("len %d size %d, want 4 entries filling %d", b.Len(), b.Size(), budget)
	}
	if _, ok := b.Get("k0"); !ok { // k0 is now the most recent: k1 goes first
		t.Fatal("k0 missing")
	}
	b.Add("k4", small)
	if _, ok := b.Get("k1"); ok {
		t.Fatal("k1, the least recently used, was kept")
	}
	for _, k := range []string{"k0", "k2", "k3", "k4"} {
		if v, ok := b.Get(k); !ok || v != small {
			t.Fatalf("%s: %q %v", k, v, ok)
		}
	}
	// one large value, a byte more than three small ones, leaves no room for a fourth
	large := strings.Repeat("L", int(3*cost("k0", small)+1-lru.BytesEntryOverhead-2))
	b.Add("kL", large)
	if b.Size() > budget {
		t.Fatalf("size %d past the budget %d", b.Size(), budget)
	}
	if v, ok := b.Get("kL"); !ok || v != large || b.Len() != 1 {
		t.Fatalf("large value: ok %v, %d entries", ok, b.Len())
	}
	// a value larger than the budget is not kept, and takes its key's old value out
	b.Add("kL", strings.Repeat("x", int(budget)))
	if _, ok := b.Get("kL"); ok || b.Len() != 0 || b.Size() != 0 {
		t.Fatalf("an oversized value: ok %v, %d entries, %d bytes", ok, b.Len(), b.Size())
	}
}

func TestBytesReplaceRemoveAndCloseKeepTheSizeExact(t *testing.T) {
	b := newBytes(t, 1<<20, time.Hour)
	b.Add("a#1", "one")
	b.Add("a#1", "uno")
	if v, _ := b.Get("a#1"); v != "uno" || b.Size() != cost("a#1", "uno") {
		t.Fatalf("replaced: %q, size %d", v, b.Size())
	}
	b.Add("a#2", "two")
	b.Add("b", "three")
	b.Remove("b")
	if _, ok := b.Get("b"); ok {
		t.Fatal("removed key found")
	}
	if n := b.RemovePrefix("a#"); n != 2 || b.Len() != 0 || b.Size() != 0 {
		t.Fatalf("RemovePrefix removed %d, left %d entries, %d bytes", n, b.Len(), b.Size())
	}
	b.Add("c", "")
	if v, ok := b.Get("c"); !ok || v != "" {
		t.Fatal("an empty value is a value")
	}
	b.Close()
	b.Add("d", "x")
	if _, ok := b.Get("c"); ok || b.Len() != 0 {
		t.Fatal("entries after Close")
	}
	b.Close() // idempotent
}

func TestBytesEntriesExpireAtTheirTTLOrAddForDuration(t *testing.T) {
	var clk fakeClock
	b := newBytes(t, 1<<20, time.Minute, lru.WithClock(clk.Now))
	b.Add("a", "1")
	b.AddFor("b", "2", 10*time.Second)
	b.AddFor("c", "3", time.Hour) // capped at the TTL
	b.AddFor("d", "4", 0)         // nothing
	clk.Advance(10 * time.Second)
	if _, ok := b.Get("b"); ok {
		t.Fatal("b outlived its AddFor")
	}
	if _, ok := b.Get("d"); ok {
		t.Fatal("AddFor(0) added")
	}
	clk.Advance(50*time.Second - 1)
	for _, k := range []string{"a", "c"} {
		if _, ok := b.Get(k); !ok {
			t.Fatalf("%s gone before its TTL", k)
		}
	}
	clk.Advance(1)
	for _, k := range []string{"a", "c"} {
		if _, ok := b.Get(k); ok {
			t.Fatalf("%s outlived its TTL", k)
		}
	}
	if b.Len() != 0 || b.Size() != 0 {
		t.Fatalf("expired entries read are reclaimed: %d left, %d bytes", b.Len(), b.Size())
	}
}

// Concurrent use under -race: the size stays within the budget and matches what is
// held.
func TestBytesSizeStaysWithinBudgetUnderConcurrentUse(t *testing.T) {
	const budget = 64 << 10
	b := newBytes(t, budget, time.Hour)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				k := fmt.Sprintf("k%d", (g*7919+i)%500)
				switch i % 4 {
				case 0, 1:
					b.Add(k, strings.Repeat("v", i%2048))
				case 2:
					if v, ok := b.Get(k); ok && strings.Trim(v, "v") != "" {
						t.Errorf("%s holds %q", k, v[:min(len(v), 10)])
					}
				case 3:
					if i%100 == 3 {
						b.RemovePrefix("k1")
					} else {
						b.Remove(k)
					}
				}
				if s := b.Size(); s > budget {
					t.Errorf("size %d past the budget", s)
				}
			}
		}()
	}
	wg.Wait()
}
