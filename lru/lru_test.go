package lru_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/lru"
)

// fakeClock is a concurrency-safe manual time source for WithClock.
type fakeClock struct{ ns atomic.Int64 }

func (f *fakeClock) Now() time.Time          { return time.Unix(0, f.ns.Load()) }
func (f *fakeClock) Advance(d time.Duration) { f.ns.Add(int64(d)) }

func newCache(t *testing.T, size int, ttl time.Duration, opts ...lru.Option) *lru.Cache {
	t.Helper()
	c, err := lru.New(size, ttl, opts...)
	if err != nil {
		t.Fatalf("New(%d, %v): %v", size, ttl, err)
	}
	t.Cleanup(c.Close)
	return c
}

func key(i int) string { return fmt.Sprintf("key-%d", i) }

func TestNewRefusesInvalidSettingsNamingThem(t *testing.T) {
	tests := []struct {
		name    string
		size    int
		ttl     time.Duration
		opts    []lru.Option
		setting string // must appear in the error
	}{
		{"size zero", 0, time.Minute, nil, "size"},
		{"size negative", -1, time.Minute, nil, "size"},
		{"ttl zero", 10, 0, nil, "ttl"},
		{"ttl negative", 10, -time.Second, nil, "ttl"},
		{"shards zero", 10, time.Minute, []lru.Option{lru.WithShards(0)}, "WithShards"},
		{"shards negative", 10, time.Minute, []lru.Option{lru.WithShards(-4)}, "WithShards"},
		{"shards huge", 10, time.Minute, []lru.Option{lru.WithShards(1 << 17)}, "WithShards"},
		{"nil clock", 10, time.Minute, []lru.Option{lru.WithClock(nil)}, "WithClock"},
		{"nil option", 10, time.Minute, []lru.Option{nil}, "nil Option"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := lru.New(tt.size, tt.ttl, tt.opts...)
			if !errors.Is(err, lru.ErrInvalidOption) {
				t.Fatalf("err = %v, want ErrInvalidOption", err)
			}
			if c != nil {
				t.Errorf("cache = %v, want nil", c)
			}
			if !strings.Contains(err.Error(), tt.setting) {
				t.Errorf("err = %q, does not name %q", err, tt.setting)
			}
		})
	}
}

func TestCapRoundsUpToWholeShards(t *testing.T) {
	tests := []struct {
		size    int
		opts    []lru.Option
		wantCap int
	}{
		{1, nil, 1},
		{8, nil, 8},
		{100, nil, 104},       // 8 shards of 13
		{10_000, nil, 10_048}, // 64 shards of 157
		{10, []lru.Option{lru.WithShards(3)}, 12}, // 4 shards of 3
		{2, []lru.Option{lru.WithShards(8)}, 8},   // each shard holds at least one
	}
	for _, tt := range tests {
		c := newCache(t, tt.size, time.Minute, tt.opts...)
		if got := c.Cap(); got != tt.wantCap {
			t.Errorf("New(%d).Cap() = %d, want %d", tt.size, got, tt.wantCap)
		}
	}
}

func TestContainsFindsExactlyTheAddedKeys(t *testing.T) {
	c := newCache(t, 100, time.Minute)
	if c.Contains("a") {
		t.Fatal("empty cache contains a")
	}
	c.Add("a")
	c.Add("")
	if !c.Contains("a") || !c.Contains("") {
		t.Fatal("added keys missing")
	}
	if c.Contains("b") {
		t.Fatal("contains b, never added")
	}
	c.Add("a")
	if got := c.Len(); got != 2 {
		t.Fatalf("Len = %d, want 2", got)
	}
}

// Keys up to 39 bytes live inside their node, longer ones beside it.
func TestShortAndLongKeysAreBothHeldExactly(t *testing.T) {
	c := newCache(t, 64, time.Minute, lru.WithShards(1))
	long := strings.Repeat("x", 100)
	var added []string
	for _, n := range []int{0, 1, 38, 39, 40, 41, 100} {
		added = append(added, long[:n])
	}
	for _, k := range added[:len(added)-1] { // all but the 100-byte key
		c.Add(k)
	}
	for _, k := range added[:len(added)-1] {
		if !c.Contains(k) {
			t.Errorf("%d-byte key missing", len(k))
		}
	}
	for _, k := range []string{long, long[:99], strings.Repeat("y", 40), strings.Repeat("y", 39)} {
		if c.Contains(k) {
			t.Errorf("%d-byte key present, never added", len(k))
		}
	}
	c.Remove(long[:40])
	if c.Contains(long[:40]) || !c.Contains(long[:41]) {
		t.Error("Remove of a long key removed the wrong one")
	}
}

// The cache must not pin the buffer a key was sliced from.
func TestAddCopiesKey(t *testing.T) {
	c := newCache(t, 10, time.Minute)
	buf := []byte("abc")
	c.Add(string(buf))
	buf[0] = 'x'
	if !c.Contains("abc") {
		t.Fatal("key changed with caller's buffer")
	}
}

func TestLenNeverExceedsCap(t *testing.T) {
	for _, shards := range []int{1, 4, 64} {
		t.Run(fmt.Sprintf("shards:%d", shards), func(t *testing.T) {
			c := newCache(t, 1000, time.Hour, lru.WithShards(shards))
			for i := range 100_000 {
				c.Add(key(i))
				if i%997 == 0 && c.Len() > c.Cap() {
					t.Fatalf("after %d adds Len = %d > Cap = %d", i+1, c.Len(), c.Cap())
				}
			}
			if c.Len() != c.Cap() {
				t.Errorf("Len = %d, want full Cap %d", c.Len(), c.Cap())
			}
			held := 0
			for i := range 100_000 {
				if c.Contains(key(i)) {
					held++
				}
			}
			if held != c.Len() {
				t.Errorf("%d keys answer Contains, Len = %d", held, c.Len())
			}
			for i := 100_000 - 10; i < 100_000; i++ { // the newest survive
				if !c.Contains(key(i)) {
					t.Errorf("newest key %d evicted", i)
				}
			}
		})
	}
}

func TestKeyExpiresAtItsTTL(t *testing.T) {
	clk := &fakeClock{}
	c := newCache(t, 8, 10*time.Second, lru.WithClock(clk.Now), lru.WithShards(1))
	c.Add("a")
	clk.Advance(10*time.Second - 1)
	if !c.Contains("a") {
		t.Fatal("a expired before its TTL")
	}
	clk.Advance(1)
	if c.Contains("a") {
		t.Fatal("a present at its TTL")
	}
	if got := c.Len(); got != 1 {
		t.Errorf("Len = %d, want 1: expiry is lazy", got)
	}
	c.Add("a") // an expired key is reused, not duplicated
	if !c.Contains("a") || c.Len() != 1 {
		t.Fatalf("re-added a: Contains = %v, Len = %d", c.Contains("a"), c.Len())
	}
}

func TestAddingAgainRefreshesTheTTL(t *testing.T) {
	clk := &fakeClock{}
	c := newCache(t, 8, 10*time.Second, lru.WithClock(clk.Now))
	c.Add("a")
	clk.Advance(6 * time.Second)
	c.Add("a")
	clk.Advance(6 * time.Second)
	if !c.Contains("a") {
		t.Fatal("a expired 12s after first Add, 6s after refresh")
	}
	clk.Advance(4 * time.Second)
	if c.Contains("a") {
		t.Fatal("a present 10s after refresh")
	}
}

// CLOCK: a key read since the hand last passed gets a second chance.
func TestReadKeyGetsASecondChance(t *testing.T) {
	c := newCache(t, 8, time.Hour, lru.WithShards(1))
	for i := range 8 {
		c.Add(key(i))
	}
	for i := range 4 {
		c.Contains(key(i))
	}
	for i := 100; i < 104; i++ {
		c.Add(key(i))
	}
	for i := range 8 {
		if got, want := c.Contains(key(i)), i < 4; got != want {
			t.Errorf("Contains(%s) = %v, want %v", key(i), got, want)
		}
	}
}

// An expired key is evicted even though it was referenced, ahead of live ones.
func TestEvictsExpiredFirst(t *testing.T) {
	clk := &fakeClock{}
	c := newCache(t, 4, 10*time.Second, lru.WithClock(clk.Now), lru.WithShards(1))
	for _, k := range []string{"a", "b", "c", "d"} {
		c.Add(k)
	}
	clk.Advance(5 * time.Second)
	c.Add("a")
	c.Add("b")
	c.Add("c")
	c.Contains("d") // referenced, then expires
	clk.Advance(7 * time.Second)
	c.Add("e")
	for k, want := range map[string]bool{"a": true, "b": true, "c": true, "d": false, "e": true} {
		if got := c.Contains(k); got != want {
			t.Errorf("Contains(%q) = %v, want %v", k, got, want)
		}
	}
}

// Over a larger cache, keys read between insert waves outlive those not read.
func TestReadKeysOutliveUnreadOnes(t *testing.T) {
	c := newCache(t, 1024, time.Hour, lru.WithShards(4))
	for i := range c.Cap() {
		c.Add(key(i))
	}
	for i := 0; i < c.Cap(); i += 2 {
		c.Contains(key(i))
	}
	for i := range c.Cap() / 2 {
		c.Add(key(1_000_000 + i))
	}
	var hot, cold int
	for i := range c.Cap() {
		if c.Contains(key(i)) {
			if i%2 == 0 {
				hot++
			} else {
				cold++
			}
		}
	}
	if hot < c.Cap()/2*9/10 || cold > c.Cap()/2/10 {
		t.Errorf("survivors: referenced %d, unreferenced %d of %d each", hot, cold, c.Cap()/2)
	}
}

func TestRemoveFreesTheKeysSlot(t *testing.T) {
	c := newCache(t, 4, time.Hour, lru.WithShards(1))
	c.Remove("missing")
	for _, k := range []string{"a", "b", "c", "d"} {
		c.Add(k)
	}
	c.Remove("b")
	if c.Contains("b") || c.Len() != 3 {
		t.Fatalf("after Remove(b): Contains = %v, Len = %d", c.Contains("b"), c.Len())
	}
	c.Add("e") // takes b's slot: nothing else is evicted
	for _, k := range []string{"a", "c", "d", "e"} {
		if !c.Contains(k) {
			t.Errorf("%s evicted though a slot was free", k)
		}
	}
	c.Add("b")
	if !c.Contains("b") || c.Len() != 4 {
		t.Fatalf("re-added b: Contains = %v, Len = %d", c.Contains("b"), c.Len())
	}
}

// RemovePrefix deletes exactly the keys with the prefix, long (kept outside
// the node) and short alike, in every shard, and frees their slots.
func TestRemovePrefixDeletesExactlyThePrefixedKeys(t *testing.T) {
	c := newCache(t, 64, time.Hour, lru.WithShards(4))
	long := strings.Repeat("x", 50)
	keep := []string{"a", "ab", "b#a", "a-1", "b", long, "a" + long[:1]}
	gone := []string{"a#1", "a#2", "a#" + long, "a#"}
	for _, k := range append(append([]string{}, keep...), gone...) {
		c.Add(k)
	}
	if n := c.RemovePrefix("a#"); n != len(gone) {
		t.Fatalf("RemovePrefix removed %d keys, want %d", n, len(gone))
	}
	for _, k := range gone {
		if c.Contains(k) {
			t.Errorf("%q still held", k)
		}
	}
	for _, k := range keep {
		if !c.Contains(k) {
			t.Errorf("%q removed, though it does not start with the prefix", k)
		}
	}
	if c.Len() != len(keep) {
		t.Fatalf("Len = %d, want %d", c.Len(), len(keep))
	}
	if n := c.RemovePrefix("zzz"); n != 0 {
		t.Fatalf("RemovePrefix of an absent prefix removed %d", n)
	}
	if n := c.RemovePrefix(""); n != len(keep) || c.Len() != 0 {
		t.Fatalf(`RemovePrefix("") removed %d, Len %d; want %d, 0`, n, c.Len(), len(keep))
	}
	c.Close()
	if n := c.RemovePrefix(""); n != 0 {
		t.Fatalf("RemovePrefix after Close removed %d", n)
	}
}

// The slots RemovePrefix frees are reused: a full shard emptied by it takes as
// many new keys without evicting any of them.
func TestRemovePrefixFreesSlots(t *testing.T) {
	c := newCache(t, 16, time.Hour, lru.WithShards(1))
	for i := range 16 {
		c.Add("old#" + key(i))
	}
	if n := c.RemovePrefix("old#"); n != 16 {
		t.Fatalf("removed %d, want 16", n)
	}
	for i := range 16 {
		c.Add(key(i))
	}
	for i := range 16 {
		if !c.Contains(key(i)) {
			t.Fatalf("%s evicted, though RemovePrefix freed every slot", key(i))
		}
	}
}

// Churn through removals and re-adds in one shard exercises tombstones and
// table rebuilds; every key added and not removed must stay visible.
func TestKeysStayVisibleThroughRemovalChurn(t *testing.T) {
	c := newCache(t, 64, time.Hour, lru.WithShards(1))
	live := map[string]bool{}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20_000 {
		k := key(rng.IntN(200))
		if len(live) < 64 && rng.IntN(2) == 0 {
			c.Add(k)
			live[k] = true
		} else {
			c.Remove(k)
			delete(live, k)
		}
		if i%101 == 0 {
			for j := range 200 {
				k := key(j)
				if got := c.Contains(k); got != live[k] {
					t.Fatalf("step %d: Contains(%s) = %v, want %v", i, k, got, live[k])
				}
			}
			if c.Len() != len(live) {
				t.Fatalf("step %d: Len = %d, want %d", i, c.Len(), len(live))
			}
		}
	}
}

// Random operations with eviction and expiry: Contains may forget, but must
// never claim a key that was not added within the TTL, and an Add is always
// visible right after.
func TestContainsNeverReportsAKeyNotAddedWithinTheTTL(t *testing.T) {
	clk := &fakeClock{}
	const ttl = 100 * time.Millisecond
	c := newCache(t, 32, ttl, lru.WithClock(clk.Now), lru.WithShards(2))
	added := map[string]int64{} // key -> clock at last Add; absent = removed
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 50_000 {
		k := key(rng.IntN(300))
		switch op := rng.IntN(10); {
		case op < 4:
			c.Add(k)
			added[k] = clk.ns.Load()
			if !c.Contains(k) {
				t.Fatalf("step %d: %s missing right after Add", i, k)
			}
		case op < 5:
			c.Remove(k)
			delete(added, k)
		case op < 6:
			clk.Advance(time.Duration(rng.IntN(int(ttl / 10))))
		default:
			at, ok := added[k]
			if c.Contains(k) && (!ok || clk.ns.Load()-at >= int64(ttl)) {
				t.Fatalf("step %d: Contains(%s) = true, added %v, at %d, now %d", i, k, ok, at, clk.ns.Load())
			}
		}
		if c.Len() > c.Cap() {
			t.Fatalf("Len %d > Cap %d", c.Len(), c.Cap())
		}
	}
}

func TestClosedCacheHoldsNothing(t *testing.T) {
	c, err := lru.New(10, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c.Add("a")
	c.Close()
	if c.Contains("a") {
		t.Error("Contains(a) after Close")
	}
	c.Add("b")
	c.Remove("a")
	if c.Contains("b") || c.Len() != 0 {
		t.Errorf("after Close: Contains(b) = %v, Len = %d", c.Contains("b"), c.Len())
	}
	c.Close()
	if c.Cap() != 10 {
		t.Errorf("Cap after Close = %d, want 10", c.Cap())
	}
}

func TestContainsDoesNotAllocate(t *testing.T) {
	c := newCache(t, 1000, time.Hour)
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = key(i)
		c.Add(keys[i])
	}
	i := 0
	hit := testing.AllocsPerRun(1000, func() {
		if !c.Contains(keys[i%len(keys)]) {
			t.Fatal("miss")
		}
		i++
	})
	miss := testing.AllocsPerRun(1000, func() { c.Contains("absent") })
	if hit != 0 || miss != 0 {
		t.Errorf("allocs per Contains: hit %v, miss %v; want 0", hit, miss)
	}
}

func TestConcurrentAddsStayVisibleUnderEviction(t *testing.T) {
	const workers, perWorker = 8, 2000
	// Big enough that no shard evicts: each worker's own keys must stay.
	big := newCache(t, 16*workers*perWorker, time.Hour, lru.WithShards(8))
	// Small: constant eviction and table rebuilds under readers.
	small := newCache(t, 64, time.Hour, lru.WithShards(4))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				k := fmt.Sprintf("w%d-%d", w, i)
				big.Add(k)
				if !big.Contains(k) {
					t.Errorf("%s missing after Add", k)
					return
				}
				small.Add(k)
				small.Contains(k)
				if small.Contains("never-" + k) {
					t.Errorf("never-%s present", k)
					return
				}
				if i%3 == 0 {
					big.Remove(k)
					small.Remove(fmt.Sprintf("w%d-%d", (w+1)%workers, i))
					if big.Contains(k) {
						t.Errorf("%s present after its own Remove", k)
						return
					}
				}
				if i%50 == 0 && (small.Len() > small.Cap() || big.Len() > big.Cap()) {
					t.Errorf("Len over Cap")
					return
				}
			}
		})
	}
	wg.Wait()
	for w := range workers {
		for i := range perWorker {
			k := fmt.Sprintf("w%d-%d", w, i)
			if got, want := big.Contains(k), i%3 != 0; got != want {
				t.Fatalf("Contains(%s) = %v, want %v", k, got, want)
			}
		}
	}
}

// Close racing with readers and writers must neither crash nor race.
func TestCloseRacingReadersAndWritersIsSafe(t *testing.T) {
	c, err := lru.New(64, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 5000 {
				k := key(w*10_000 + i)
				c.Add(k)
				c.Contains(k)
				c.Remove(k)
			}
		})
	}
	c.Close()
	wg.Wait()
	c.Close()
	if c.Len() != 0 || c.Contains(key(1)) {
		t.Error("cache not empty after Close")
	}
}

func TestAddForExpiresAtItsOwnTTLCappedByTheCaches(t *testing.T) {
	clk := &fakeClock{}
	c := newCache(t, 8, 10*time.Second, lru.WithClock(clk.Now), lru.WithShards(1))
	c.AddFor("short", 2*time.Second)
	c.AddFor("capped", time.Hour) // never beyond the cache's TTL
	c.AddFor("none", 0)
	if c.Contains("none") {
		t.Fatal("AddFor with ttl 0 added the key")
	}
	clk.Advance(2 * time.Second)
	if c.Contains("short") {
		t.Fatal("short outlived its own ttl")
	}
	if !c.Contains("capped") {
		t.Fatal("capped expired early")
	}
	clk.Advance(8 * time.Second)
	if c.Contains("capped") {
		t.Fatal("capped outlived the cache TTL")
	}
}
