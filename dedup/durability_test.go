package dedup

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// The tests here lose Redis's data the ways the README's Limits name (a restart
// without persistence, eviction) and the ways that are safe (AOF, noeviction), on
// redis-server processes of their own, and count the duplicates that get through.

// instance is one consumer process's view: a Deduper over a client of its own, and
// the handler "orders".
type instance struct {
	d *Deduper
	h *Handler
}

func newInstance(t *testing.T, c redis.UniversalClient, prefix string, opts ...HandlerOption) instance {
	t.Helper()
	return instanceOn(t, c, nil, prefix, "orders", append([]HandlerOption{WithLease(2 * time.Second)}, opts...)...)
}

// instanceOn is an instance over a Redis store of c with storeOpts, and the handler
// name with opts.
func instanceOn(t *testing.T, c redis.UniversalClient, storeOpts []redisstore.Option, prefix, name string, opts ...HandlerOption) instance {
	t.Helper()
	store, err := redisstore.New(c, storeOpts...)
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(store, WithPrefix(prefix), WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	h, err := d.Register(name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return instance{d, h}
}

func orderKey(i int) string { return fmt.Sprintf("order-%05d", i) }

// processAll runs Do for every key with fn counted in runs, on workers goroutines,
// and returns the outcome per key.
func processAll(t *testing.T, h *Handler, keys []string, runs *tally, workers int) map[string]Outcome {
	t.Helper()
	var mu sync.Mutex
	out := make(map[string]Outcome, len(keys))
	next := atomic.Int64{}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(keys) {
					return
				}
				res, _ := h.Do(context.Background(), keys[i], runs.fn(keys[i]))
				mu.Lock()
				out[keys[i]] = res.Outcome
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

func keysWith(outcomes map[string]Outcome, o Outcome) []string {
	var ks []string
	for k, got := range outcomes {
		if got == o {
			ks = append(ks, k)
		}
	}
	return ks
}

// A restart loses what Redis had not persisted, and each lost DONE record lets one
// duplicate through when the message comes again: the duplicates are exactly the
// lost records. Without persistence every record is lost; with RDB snapshots, those
// written since the last one.
func TestRestartLosesUnpersistedRecords(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		snapshotAt int // SAVE after this many keys; -1: never
	}{
		{"no persistence", -1},
		{"rdb snapshot", 150},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := testenv.SpawnRedis(t) // --save "" --appendonly no
			c := clientOf(t, srv)
			prefix := testenv.Prefix()
			first := newInstance(t, c, prefix)
			keys := make([]string, 400)
			for i := range keys {
				keys[i] = orderKey(i)
			}
			runs := newTally()
			split := len(keys)
			if tc.snapshotAt >= 0 {
				split = tc.snapshotAt
			}
			out := processAll(t, first.h, keys[:split], runs, 4)
			if tc.snapshotAt >= 0 {
				if err := c.Save(context.Background()).Err(); err != nil {
					t.Fatal(err)
				}
				for k, o := range processAll(t, first.h, keys[split:], runs, 4) {
					out[k] = o
				}
			}
			if n := len(keysWith(out, Processed)); n != len(keys) {
				t.Fatalf("%d of %d processed before the restart", n, len(keys))
			}
			doneBefore, _ := recordCounts(t, c, prefix)

			if err := srv.Restart(); err != nil { // SIGKILL, then the same port and directory
				t.Fatal(err)
			}
			doneAfter, _ := recordCounts(t, c, prefix)
			lost := make(map[string]bool)
			for _, k := range keys {
				n, err := c.Exists(context.Background(), first.h.RecordKey(k)).Result()
				if err != nil {
					t.Fatal(err)
				}
				if n == 0 {
					lost[k] = true
				}
			}
			if len(lost) != doneBefore-doneAfter {
				t.Fatalf("%d records missing, but the counts say %d before and %d after", len(lost), doneBefore, doneAfter)
			}

			// every message comes again, to another instance (its local tier is empty)
			replay := newTally()
			other := newInstance(t, c, prefix)
			processAll(t, other.h, keys, replay, 4)
			dupKeys, dupRuns := replay.twice()
			dup := 0
			for _, k := range keys {
				if n := replay.of(k); n > 0 {
					dup += n
					if !lost[k] {
						t.Errorf("%s ran again though its record survived", k)
					}
				} else if lost[k] {
					t.Errorf("%s's record was lost but the replay did not run it (a message dropped)", k)
				}
			}
			t.Logf("%s: %d DONE before the restart, %d after: %d lost; replay of all %d messages: %d duplicates",
				tc.name, doneBefore, doneAfter, len(lost), len(keys), dup)
			if dup > len(lost) || dupKeys != 0 || dupRuns != 0 {
				t.Fatalf("%d duplicates for %d lost records", dup, len(lost))
			}
			if tc.snapshotAt < 0 && len(lost) != len(keys) || tc.snapshotAt >= 0 && len(lost) != len(keys)-split {
				t.Fatalf("%d records lost; want every record written after the last snapshot", len(lost))
			}

			// the instance that processed them still knows them from its local tier
			again := newTally()
			processAll(t, first.h, keys, again, 4)
			if n := again.total(); n != 0 {
				t.Fatalf("the first instance ran %d messages again", n)
			}
		})
	}
}

// With appendonly yes and appendfsync always, every DONE record that Redis
// acknowledged (Do answered Processed) survives a kill -9 in the middle of the load:
// replaying them after the restart runs none of them again. The Do calls that the
// kill caught are counted and left out: a claim never answered, and NotRecorded (the
// README's Limits: fn ran, DONE was not written).
//
// kill -9 ends the process, not the machine: the kernel still has what Redis wrote to
// the AOF. So this test tells AOF from no persistence (with appendonly no it fails,
// every record lost), not always from everysec or no, which only a machine crash
// separates; it passes with those too.
func TestAppendfsyncAlwaysSurvivesKill9(t *testing.T) {
	t.Parallel()
	srv := testenv.SpawnRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	c := clientOf(t, srv)
	prefix := testenv.Prefix()
	first := newInstance(t, c, prefix)

	var (
		mu       sync.Mutex
		outcomes = make(map[string]Outcome)
		n        atomic.Int64
		killed   atomic.Bool
		wg       sync.WaitGroup
	)
	runs := newTally()
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				k := fmt.Sprintf("w%d-%05d", w, i)
				res, _ := first.h.Do(context.Background(), k, runs.fn(k))
				mu.Lock()
				outcomes[k] = res.Outcome
				mu.Unlock()
				if n.Add(1) > 20_000 || killed.Load() && res.Outcome != Processed {
					return
				}
			}
		})
	}
	testenv.Eventually(t, 30*time.Second, "300 keys processed", func() bool { return n.Load() >= 300 })
	srv.Kill() // kill -9 while the workers run
	killed.Store(true)
	wg.Wait()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}

	processed := keysWith(outcomes, Processed)
	replay := newTally()
	other := newInstance(t, c, prefix)
	res := processAll(t, other.h, processed, replay, 4)
	dupKeys, _ := replay.twice()
	ranAgain := 0
	for _, k := range processed {
		if replay.of(k) > 0 {
			ranAgain++
		}
	}
	counts := make(map[Outcome]int)
	for _, o := range outcomes {
		counts[o]++
	}
	t.Logf("before the kill: %d processed, %d not recorded, %d store unavailable; replay of the processed: %d duplicates",
		counts[Processed], counts[NotRecorded], counts[StoreUnavailable], ranAgain)
	if ranAgain != 0 || dupKeys != 0 {
		t.Fatalf("%d of %d acknowledged DONE records were lost by kill -9 with appendfsync always", ranAgain, len(processed))
	}
	if n := len(keysWith(res, Duplicate)); n != len(processed) {
		t.Fatalf("replay: %d duplicates of %d", n, len(processed))
	}
}

// Under allkeys-lru with a small maxmemory, Redis evicts DONE records to make room,
// and each evicted record lets a duplicate through. Under noeviction, a full Redis
// refuses new claims: Do answers StoreUnavailable (fn not run; the adapter naks) and
// no processed message runs twice.
func TestEvictionLetsDuplicatesThroughAndNoevictionRefusesClaims(t *testing.T) {
	t.Parallel()
	const headroom = 192 << 10 // bytes above what a server with our clients and scripts uses
	for _, policy := range []string{"allkeys-lru", "noeviction"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			srv := testenv.SpawnRedis(t, "--maxmemory-policy", policy)
			c := clientOf(t, srv)
			ctx := context.Background()
			prefix := testenv.Prefix()
			first := newInstance(t, c, prefix, WithLocalCache(0, 0))
			if res, err := first.h.Do(ctx, "warm-up", ok); res.Outcome != Processed { // scripts loaded, connections open
				t.Fatal(res.Outcome, err)
			}
			used, err := strconv.ParseInt(testenv.InfoField(t, c, "memory", "used_memory"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used+headroom, 10)).Err(); err != nil {
				t.Fatal(err)
			}
			keys := make([]string, 2000)
			for i := range keys {
				keys[i] = orderKey(i)
			}
			runs := newTally()
			out := make(map[string]Outcome, len(keys))
			var storeErr error
			for _, k := range keys { // one at a time: the memory fills in key order
				res, err := first.h.Do(ctx, k, runs.fn(k))
				out[k] = res.Outcome
				if res.Outcome == StoreUnavailable && storeErr == nil {
					storeErr = err
				}
			}
			replay := newTally()
			other := newInstance(t, c, prefix, WithLocalCache(0, 0))
			processAll(t, other.h, keys, replay, 1)
			// every eviction, the replay's own included: an evicted record lets at most
			// one extra run through
			evicted, _ := strconv.Atoi(testenv.InfoField(t, c, "stats", "evicted_keys"))
			// duplicates of processed messages; a NotRecorded one (fn ran, DONE refused at
			// the memory limit) is the README's NotRecorded window, not eviction's
			extra := extraRuns(runs, replay, keysWith(out, Processed))
			counts := make(map[Outcome]int)
			for _, o := range out {
				counts[o]++
			}
			t.Logf("%s, maxmemory = warmed-up + %d KiB: %d processed, %d store unavailable, %d not recorded, %d lease lost; %d keys evicted; replay of all %d: %d duplicate runs",
				policy, headroom>>10, counts[Processed], counts[StoreUnavailable], counts[NotRecorded], counts[LeaseLost], evicted, len(keys), extra)

			switch policy {
			case "allkeys-lru":
				if counts[StoreUnavailable] != 0 {
					t.Fatalf("%d store failures: an evicting Redis is never full", counts[StoreUnavailable])
				}
				if evicted == 0 || extra == 0 {
					t.Fatalf("%d duplicates, %d keys evicted: the test did not fill the memory", extra, evicted)
				}
				if extra > evicted {
					t.Fatalf("%d duplicates for %d evicted keys", extra, evicted)
				}
			case "noeviction":
				if extra != 0 {
					t.Fatalf("%d duplicate runs under noeviction", extra)
				}
				if counts[StoreUnavailable] == 0 {
					t.Fatal("the memory never filled up: the test proves nothing")
				}
				if !errors.Is(storeErr, ErrStoreUnavailable) || !strings.Contains(storeErr.Error(), "OOM") {
					t.Fatalf("a full Redis answered %v; want ErrStoreUnavailable with Redis's OOM error", storeErr)
				}
				for _, k := range keysWith(out, StoreUnavailable) {
					if runs.of(k) != 0 {
						t.Fatalf("%s ran though Do answered StoreUnavailable", k)
					}
				}
				if evicted != 0 {
					t.Fatalf("%d keys evicted under noeviction", evicted)
				}
			}
		})
	}
}
