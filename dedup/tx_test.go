package dedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/internal/batcher"
	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// The transactional marker's lifecycle (docs/design.md §9) over fakeDB: the step around fn
// inside claim → run → complete. The same paths against PostgreSQL, MariaDB and
// SQLite, with processes killed, are in the sqltx and nats tests.

// effect is a transactional fn that writes key's effect in tx.
func effect(key string) func(context.Context, *fakeTx) error {
	return func(_ context.Context, tx *fakeTx) error {
		tx.write(key)
		return nil
	}
}

func TestDoTxRunsOnceAndCommitsItsMarker(t *testing.T) {
	f := newFixture(t, true)
	h := f.handler("orders")
	db := newFakeDB()
	ctx := context.Background()
	res, err := DoTx(ctx, h, "o-1", db, effect("o-1"))
	if res.Outcome != Processed || err != nil {
		t.Fatalf("first: %v %v", res.Outcome, err)
	}
	if res, _ := DoTx(ctx, h, "o-1", db, effect("o-1")); res.Outcome != Duplicate || res.Tier != TierLocal {
		t.Fatalf("second: %v %v, want a local Duplicate", res.Outcome, res.Tier)
	}
	if db.effectsOf("o-1") != 1 || !db.markerOf(h, "o-1") {
		t.Fatalf("effects %d, marker %v", db.effectsOf("o-1"), db.markerOf(h, "o-1"))
	}
	if b, c, r, _ := db.counts(); b != 1 || c != 1 || r != 0 {
		t.Fatalf("begins %d commits %d rollbacks %d: a duplicate reached the database", b, c, r)
	}
	// the completion follows the commit in the background: the run is Processed once
	// committed, whatever it answers
	testenv.Eventually(t, 5*time.Second, "the store's DONE", func() bool {
		ans, _ := claim1(ctx, f.mem, h.RecordKey("o-1"), "other", "", time.Minute)
		return ans.Status == driver.StatusDuplicate
	})
}

// A process killed between COMMIT and the completion leaves the store without DONE
// (here: another Deduper, over a store that never got it). The redelivery's marker
// answers Duplicate from the database, fn does not run, and the store is repaired.
func TestDoTxMarkerFoundAnswersDuplicateAndRepairsTheStore(t *testing.T) {
	db := newFakeDB()
	ctx := context.Background()
	first := newFixture(t, true).handler("orders")
	if res, err := DoTx(ctx, first, "o-1", db, effect("o-1")); res.Outcome != Processed {
		t.Fatal(res.Outcome, err)
	}
	f := newFixture(t, true) // its store lost the record; its local tier never had it
	h := f.handler("orders")
	res, err := DoTx(ctx, h, "o-1", db, effect("o-1"))
	if res.Outcome != Duplicate || res.Tier != TierDatabase || err != nil {
		t.Fatalf("redelivery: %v %v %v, want a Duplicate from the database", res.Outcome, res.Tier, err)
	}
	if db.effectsOf("o-1") != 1 {
		t.Fatalf("effects %d", db.effectsOf("o-1"))
	}
	testenv.Eventually(t, 5*time.Second, "the store's DONE, repaired", func() bool {
		ans, _ := claim1(ctx, f.mem, h.RecordKey("o-1"), "other", "", time.Minute)
		return ans.Status == driver.StatusDuplicate
	})
	if h.Stats().DatabaseDuplicates != 1 {
		t.Fatalf("stats %+v", h.Stats())
	}
	if res, _ := DoTx(ctx, h, "o-1", db, effect("o-1")); res.Outcome != Duplicate || res.Tier != TierLocal {
		t.Fatalf("after the repair: %v %v, want local", res.Outcome, res.Tier)
	}
	if db.openTxs() != 0 {
		t.Fatal("a transaction was left open")
	}
}

// fn's error or panic rolls the transaction back, marker included, and releases the
// claim: the next delivery runs it, once.
func TestDoTxFailureRollsBackAndRunsAgain(t *testing.T) {
	for name, bad := range map[string]func(context.Context, *fakeTx) error{
		"error": func(_ context.Context, tx *fakeTx) error { tx.write("o-1"); return errors.New("boom") },
		"panic": func(_ context.Context, tx *fakeTx) error { tx.write("o-1"); panic("kaboom") },
	} {
		t.Run(name, func(t *testing.T) {
			h := newFixture(t, true).handler("orders")
			db := newFakeDB()
			ctx := context.Background()
			res, err := DoTx(ctx, h, "o-1", db, bad)
			want := map[string]Outcome{"error": Failed, "panic": Panicked}[name]
			if res.Outcome != want || err == nil {
				t.Fatalf("%v %v, want %v", res.Outcome, err, want)
			}
			if db.effectsOf("o-1") != 0 || db.markerOf(h, "o-1") {
				t.Fatalf("rolled back run left effects %d, marker %v", db.effectsOf("o-1"), db.markerOf(h, "o-1"))
			}
			if res, err := DoTx(ctx, h, "o-1", db, effect("o-1")); res.Outcome != Processed {
				t.Fatalf("redelivery: %v %v", res.Outcome, err)
			}
			if db.effectsOf("o-1") != 1 || db.openTxs() != 0 {
				t.Fatalf("effects %d, open %d", db.effectsOf("o-1"), db.openTxs())
			}
		})
	}
}

// A COMMIT the database refused, or one whose outcome is unknown, holds nothing in
// the store (a transactional run claims nothing): the next delivery, in another
// process, goes straight to the database, and the marker decides whether the commit
// happened.
func TestDoTxRefusedOrUnknownCommitLeavesItToTheMarker(t *testing.T) {
	for _, tc := range []struct {
		name        string
		set         func(db *fakeDB)
		want        Outcome
		again       Outcome
		againTier   Tier
		effectsThen int
	}{
		{"refused", func(db *fakeDB) { db.failCommit = errors.New("serialization failure") }, Failed, Processed, TierNone, 1},
		{"unknown, applied", func(db *fakeDB) { db.unknownCommit, db.unknownApply = true, true }, CommitUnknown, Duplicate, TierDatabase, 1},
		{"unknown, not applied", func(db *fakeDB) { db.unknownCommit = true }, CommitUnknown, Processed, TierNone, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, true)
			h := f.handler("orders")
			other := newDeduperOver(t, f.store).mustRegister(t, "orders") // another process
			db := newFakeDB()
			ctx := context.Background()
			db.set(tc.set)
			res, err := DoTx(ctx, h, "o-1", db, effect("o-1"))
			if res.Outcome != tc.want || err == nil {
				t.Fatalf("%v %v, want %v", res.Outcome, err, tc.want)
			}
			if tc.want == CommitUnknown && (!errors.Is(err, ErrCommitUnknown) || res.RetryAfter <= 0) {
				t.Fatalf("err %v, retry after %v", err, res.RetryAfter)
			}
			db.set(func(db *fakeDB) { db.failCommit, db.unknownCommit = nil, false })
			res, _ = DoTx(ctx, other, "o-1", db, effect("o-1"))
			if res.Outcome != tc.again || res.Tier != tc.againTier {
				t.Fatalf("the redelivery: %v %v, want %v %v", res.Outcome, res.Tier, tc.again, tc.againTier)
			}
			if db.effectsOf("o-1") != tc.effectsThen || db.openTxs() != 0 {
				t.Fatalf("effects %d, open transactions %d", db.effectsOf("o-1"), db.openTxs())
			}
		})
	}
}

// The database down: StoreUnavailable, fn not run, the claim released.
func TestDoTxDatabaseDownIsStoreUnavailable(t *testing.T) {
	f := newFixture(t, true)
	h := f.handler("orders")
	db := newFakeDB()
	db.set(func(db *fakeDB) { db.failBegin = errors.New("connection refused") })
	ctx := context.Background()
	ran := false
	res, err := DoTx(ctx, h, "o-1", db, func(context.Context, *fakeTx) error { ran = true; return nil })
	if res.Outcome != StoreUnavailable || !errors.Is(err, ErrStoreUnavailable) || ran {
		t.Fatalf("%v %v ran=%v", res.Outcome, err, ran)
	}
	db.set(func(db *fakeDB) { db.failBegin = nil })
	if res, err := DoTx(ctx, h, "o-1", db, effect("o-1")); res.Outcome != Processed {
		t.Fatalf("once the database is back: %v %v (claim not released?)", res.Outcome, err)
	}
}

// Redis down: a transactional run claims nothing, so under every store-failure policy
// it goes on with its marker alone, once, concurrent copies in two processes
// included, and no claim reaches the store.
func TestDoTxStoreDownRunsOnTheMarker(t *testing.T) {
	down := errors.New("redis: connection refused")
	for _, p := range []StoreFailurePolicy{FailClosed, FailOpen, DatabaseOnly} {
		t.Run(fmt.Sprint("policy ", p), func(t *testing.T) {
			f := newFixture(t, true)
			h := f.handler("orders", WithStoreFailure(p))
			other := newDeduperOver(t, f.store).mustRegister(t, "orders", WithStoreFailure(p))
			f.store.onFail(func(string) error { return down })
			db := newFakeDB()
			var wg sync.WaitGroup
			var ran atomic.Int64
			results := make([]Result, 8)
			start := make(chan struct{})
			for i := range results {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					hh := h
					if i%2 == 1 {
						hh = other
					}
					results[i], _ = DoTx(context.Background(), hh, "o-1", db, func(ctx context.Context, tx *fakeTx) error {
						ran.Add(1)
						time.Sleep(10 * time.Millisecond)
						tx.write("o-1")
						return nil
					})
				}()
			}
			close(start)
			wg.Wait()
			// in each process one call leads the key and the others see it running
			// (InProgress); the two leaders meet at the marker: one runs, the other
			// finds it committed
			processed, fromDB := 0, 0
			for _, r := range results {
				switch {
				case r.Outcome == Processed:
					processed++
				case r.Outcome == Duplicate && r.Tier == TierDatabase:
					fromDB++
				case r.Outcome == InProgress:
				default:
					t.Errorf("result %v %v", r.Outcome, r.Tier)
				}
			}
			if processed != 1 || fromDB != 1 || ran.Load() != 1 || db.effectsOf("o-1") != 1 {
				t.Fatalf("%d processed, %d duplicates from the database, fn ran %d times, effects %d; want 1 each",
					processed, fromDB, ran.Load(), db.effectsOf("o-1"))
			}
			if n := f.store.claims.Load(); n != 0 {
				t.Fatalf("%d claims reached the store", n)
			}
		})
	}
}

// Two runs of one key overlap, in two processes: B waits at its marker for A's
// transaction. If A commits, B finds the marker: Duplicate (acked). If A's fn fails,
// A rolls back and B runs. The effect commits once.
func TestDoTxOverlappingRunsCommitOnce(t *testing.T) {
	for _, aFails := range []bool{false, true} {
		t.Run(fmt.Sprint("A fails: ", aFails), func(t *testing.T) {
			f := newFixture(t, true)
			a := f.handler("orders")
			b := newDeduperOver(t, f.mem).mustRegister(t, "orders") // another process
			db := newFakeDB()
			ctx := context.Background()
			aDone := make(chan Result, 1)
			aInFn := make(chan struct{})
			release := make(chan struct{})
			go func() {
				res, _ := DoTx(ctx, a, "o-1", db, func(ctx context.Context, tx *fakeTx) error {
					close(aInFn)
					tx.write("o-1")
					<-release
					if aFails {
						return errors.New("boom")
					}
					return nil
				})
				aDone <- res
			}()
			<-aInFn
			bDone := make(chan Result, 1)
			go func() {
				res, _ := DoTx(ctx, b, "o-1", db, effect("o-1"))
				bDone <- res
			}()
			time.Sleep(50 * time.Millisecond) // B waits at the marker A holds
			select {
			case r := <-bDone:
				t.Fatalf("B answered %v while A's transaction held the marker", r.Outcome)
			default:
			}
			close(release)
			ra, rb := <-aDone, <-bDone
			t.Logf("A %v, B %v %v", ra.Outcome, rb.Outcome, rb.Tier)
			if db.effectsOf("o-1") != 1 {
				t.Fatalf("effects %d, want 1", db.effectsOf("o-1"))
			}
			if aFails {
				if ra.Outcome != Failed || rb.Outcome != Processed {
					t.Fatalf("A %v, B %v; want Failed (rolled back) and Processed", ra.Outcome, rb.Outcome)
				}
			} else if ra.Outcome != Processed || rb.Outcome != Duplicate || rb.Tier != TierDatabase {
				t.Fatalf("A %v, B %v %v; want Processed and a Duplicate from the database", ra.Outcome, rb.Outcome, rb.Tier)
			}
		})
	}
}

// A marker with another payload's fingerprint is key reuse.
func TestDoTxMarkerWithAnotherFingerprintIsKeyReuse(t *testing.T) {
	db := newFakeDB()
	ctx := context.Background()
	first := newFixture(t, true).handler("orders", WithFingerprint(true))
	if res, _ := handleKeyTx(ctx, first, "o-1", []byte("a"), db, effect("o-1")); res.Outcome != Processed {
		t.Fatal(res.Outcome)
	}
	h := newFixture(t, true).handler("orders", WithFingerprint(true)) // the store lost it
	if res, _ := handleKeyTx(ctx, h, "o-1", []byte("b"), db, effect("o-1")); res.Outcome != KeyReuse {
		t.Fatalf("%v, want KeyReuse", res.Outcome)
	}
	if res, _ := handleKeyTx(ctx, h, "o-1", []byte("a"), db, effect("o-1")); res.Outcome != Duplicate || res.Tier != TierDatabase {
		t.Fatalf("the same payload: %v %v", res.Outcome, res.Tier)
	}
}

// A keyless message under ProcessMissingKey runs in a transaction with no marker.
func TestDoTxKeylessMessageRunsWithoutAMarker(t *testing.T) {
	f := newFixture(t, true)
	db := newFakeDB()
	res, _ := DoTx(context.Background(), f.handler("open", WithMissingKey(ProcessMissingKey)), "", db, effect("none"))
	if res.Outcome != Processed || !res.Unguarded || db.effectsOf("none") != 1 {
		t.Fatalf("%+v, effects %d", res, db.effectsOf("none"))
	}
	if res, _ := DoTx(context.Background(), f.handler("closed"), "", db, effect("none")); res.Outcome != NoKey {
		t.Fatalf("%v, want NoKey", res.Outcome)
	}
}

// A batch: one transaction with every claimed item's marker, fn behind a savepoint
// per item, one commit, then the completions. Found markers are Duplicates from the
// database; a failing item's work and marker are rolled back to its savepoint.
// A batch that fails no item is one transaction with no savepoint: each fn runs once.
func TestRunTxWithoutFailuresIsOneTransactionWithoutSavepoints(t *testing.T) {
	db := newFakeDB()
	ctx := context.Background()
	h := newFixture(t, true).handler("orders")
	items := []Item{{Key: "a"}, {Key: "b"}, {Key: "c"}, {Key: "d"}}
	runs := map[string]int{}
	for i, r := range RunTx(ctx, h, items, db, func(_ context.Context, tx *fakeTx, i int) error {
		runs[items[i].Key]++
		tx.write(items[i].Key)
		return nil
	}) {
		if r.Outcome != Processed || r.Err != nil {
			t.Fatalf("item %d: %v %v", i, r.Outcome, r.Err)
		}
	}
	begins, commits, rollbacks, savepoints := db.counts()
	if begins != 1 || commits != 1 || rollbacks != 0 || savepoints != 0 {
		t.Errorf("%d begins, %d commits, %d rollbacks, %d savepoints; want one transaction and no savepoint", begins, commits, rollbacks, savepoints)
	}
	for _, it := range items {
		if runs[it.Key] != 1 || db.effectsOf(it.Key) != 1 || !db.markerOf(h, it.Key) {
			t.Errorf("%s: fn ran %d times, %d effects, marker %v", it.Key, runs[it.Key], db.effectsOf(it.Key), db.markerOf(h, it.Key))
		}
	}
}

// An item that fails rolls the batch's transaction back (there is no savepoint to go
// back to); the items before it and after it run again in a new transaction, each
// behind a savepoint, so a later failure is rolled back alone. Each item's outcome is
// what a batch with a savepoint per item gave, and each committed effect is there once.
func TestRunTxRerunsABatchAfterAFailureWithASavepointPerItem(t *testing.T) {
	db := newFakeDB()
	ctx := context.Background()
	f := newFixture(t, true)
	h := f.handler("orders")
	// "known": committed by a run whose store record is gone (another store)
	if res, _ := DoTx(ctx, newFixture(t, true).handler("orders"), "known", db, effect("known")); res.Outcome != Processed {
		t.Fatal(res.Outcome)
	}
	if res, _ := DoTx(ctx, h, "local", db, effect("local")); res.Outcome != Processed {
		t.Fatal(res.Outcome)
	}
	b0, c0, _, _ := db.counts()
	items := []Item{{Key: "a"}, {Key: "known"}, {Key: "fails"}, {Key: "local"}, {Key: "panics"}, {Key: "b"}, {Key: "a"}}
	var ran []int
	got := RunTx(ctx, h, items, db, func(_ context.Context, tx *fakeTx, i int) error {
		ran = append(ran, i)
		tx.write(items[i].Key)
		switch items[i].Key {
		case "fails":
			return errors.New("boom")
		case "panics":
			panic("kaboom")
		}
		return nil
	})
	want := []Outcome{Processed, Duplicate, Failed, Duplicate, Panicked, Processed, Duplicate}
	for i, r := range got {
		if r.Outcome != want[i] {
			t.Errorf("item %d (%s): %v %v, want %v", i, items[i].Key, r.Outcome, r.Err, want[i])
		}
	}
	if got[1].Tier != TierDatabase || got[3].Tier != TierLocal {
		t.Errorf("tiers: known %v, local %v", got[1].Tier, got[3].Tier)
	}
	// a, then fails: rolled back; a again, panics and b, each behind a savepoint
	if fmt.Sprint(ran) != "[0 2 0 4 5]" {
		t.Errorf("fn ran for %v, want [0 2 0 4 5]", ran)
	}
	b1, c1, _, sp := db.counts()
	if b1-b0 != 2 || c1-c0 != 1 || sp != 3 {
		t.Errorf("%d begins, %d commits, %d savepoints; want two transactions, the second committed with a savepoint per item run", b1-b0, c1-c0, sp)
	}
	for k, n := range map[string]int{"a": 1, "b": 1, "known": 1, "fails": 0, "panics": 0} {
		if db.effectsOf(k) != n {
			t.Errorf("effects of %s: %d, want %d", k, db.effectsOf(k), n)
		}
	}
	if db.markerOf(h, "fails") || db.markerOf(h, "panics") || !db.markerOf(h, "a") {
		t.Errorf("markers: fails %v, panics %v, a %v", db.markerOf(h, "fails"), db.markerOf(h, "panics"), db.markerOf(h, "a"))
	}
	// DONE in the store for the committed items and the repaired one (written in the
	// background: Close waits for it); the failures free
	f.d.Close()
	for k, want := range map[string]driver.Status{"a": driver.StatusDuplicate, "b": driver.StatusDuplicate, "known": driver.StatusDuplicate, "fails": driver.StatusAcquired, "panics": driver.StatusAcquired} {
		if ans, _ := claim1(ctx, f.mem, h.RecordKey(k), "probe", "", time.Minute); ans.Status != want {
			t.Errorf("store record of %s: %v, want %v", k, ans.Status, want)
		}
	}
	if db.openTxs() != 0 {
		t.Error("a transaction was left open")
	}
}

// A batch whose COMMIT fails, or whose outcome is unknown, leaves nothing in the
// store (a transactional run claims nothing), and its items run again on their
// redelivery, the commit not having happened.
func TestRunTxRefusedOrUnknownCommitLeavesNothingInTheStore(t *testing.T) {
	for _, unknown := range []bool{false, true} {
		t.Run(fmt.Sprint("unknown=", unknown), func(t *testing.T) {
			f := newFixture(t, true)
			h := f.handler("orders")
			db := newFakeDB()
			db.set(func(db *fakeDB) {
				if unknown {
					db.unknownCommit = true
				} else {
					db.failCommit = errors.New("deadlock detected")
				}
			})
			ctx := context.Background()
			got := RunTx(ctx, h, []Item{{Key: "a"}, {Key: "b"}}, db, func(_ context.Context, tx *fakeTx, i int) error {
				tx.write(fmt.Sprint(i))
				return nil
			})
			want := Failed
			if unknown {
				want = CommitUnknown
			}
			for i, r := range got {
				if r.Outcome != want || r.Err == nil {
					t.Errorf("item %d: %v %v, want %v", i, r.Outcome, r.Err, want)
				}
				if recs, err := f.mem.Lookup(ctx, []string{h.RecordKey(items2[i])}); err != nil || recs[0].State != driver.RecordAbsent {
					t.Errorf("item %d's record: %+v %v, want none", i, recs, err)
				}
			}
			db.set(func(db *fakeDB) { db.failCommit, db.unknownCommit = nil, false })
			for i, r := range RunTx(ctx, h, []Item{{Key: "a"}, {Key: "b"}}, db, func(_ context.Context, tx *fakeTx, i int) error {
				tx.write(fmt.Sprint(i))
				return nil
			}) {
				if r.Outcome != Processed || db.effectsOf(fmt.Sprint(i)) != 1 {
					t.Errorf("item %d again: %v %v, effects %d", i, r.Outcome, r.Err, db.effectsOf(fmt.Sprint(i)))
				}
			}
		})
	}
}

var items2 = []string{"a", "b"}

// An fn that ends its goroutine rolls the batch's transaction back, with every item's
// work, and gives back every claim.
func TestRunTxGoexitRollsBackAndGivesBackEveryClaim(t *testing.T) {
	f := newFixture(t, true)
	h := f.handler("orders")
	db := newFakeDB()
	ctx := context.Background()
	done := make(chan []ItemResult, 1)
	go func() {
		defer func() { done <- nil }()
		RunTx(ctx, h, []Item{{Key: "a"}, {Key: "b"}, {Key: "c"}}, db, func(_ context.Context, tx *fakeTx, i int) error {
			tx.write(fmt.Sprint(i))
			if i == 1 {
				runtime.Goexit()
			}
			return nil
		})
	}()
	<-done
	if db.effectsOf("0") != 0 || db.openTxs() != 0 {
		t.Fatalf("effects of item 0: %d, open transactions %d", db.effectsOf("0"), db.openTxs())
	}
	for _, k := range []string{"a", "b", "c"} {
		if res, _ := DoTx(ctx, h, k, db, effect(k)); res.Outcome != Processed {
			t.Errorf("%s after the Goexit: %v, want Processed (claim given back)", k, res.Outcome)
		}
	}
}

// More than MaxTxBatch items run as several transactions.
func TestRunTxSplitsMoreThanMaxTxBatchIntoSeveralTransactions(t *testing.T) {
	h := newFixture(t, true).handler("orders")
	db := newFakeDB()
	items := make([]Item, 2*MaxTxBatch+3)
	for i := range items {
		items[i] = Item{Key: fmt.Sprint("k-", i)}
	}
	var idx []int
	got := RunTx(context.Background(), h, items, db, func(_ context.Context, tx *fakeTx, i int) error {
		idx = append(idx, i)
		tx.write(items[i].Key)
		return nil
	})
	for i, r := range got {
		if r.Outcome != Processed || idx[i] != i {
			t.Fatalf("item %d: %v, fn's index %d", i, r.Outcome, idx[i])
		}
	}
	if b, c, _, _ := db.counts(); b != 3 || c != 3 {
		t.Fatalf("%d begins, %d commits; want 3 transactions", b, c)
	}
}

// A run whose transaction begins behind another's marker can be cancelled while it
// waits: Cancelled, claim released.
func TestDoTxCancelledWhileWaitingAtTheMarker(t *testing.T) {
	f := newFixture(t, true)
	h := f.handler("orders")
	db := newFakeDB()
	hold, err := func() (*fakeTx, error) {
		tx, _, err := db.Begin(context.Background(), []Marker{h.marker(claimed{rk: h.RecordKey("o-1"), token: "x"})})
		return tx, err
	}()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	res, err := DoTx(ctx, h, "o-1", db, effect("o-1"))
	if res.Outcome != Cancelled || err == nil || !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("%v %v, want Cancelled", res.Outcome, err)
	}
	_ = db.Rollback(context.Background(), hold)
	if res, _ := DoTx(context.Background(), h, "o-1", db, effect("o-1")); res.Outcome != Processed {
		t.Fatalf("after: %v", res.Outcome)
	}
}

// Duplicates answered by a marker are counted under the tier "database", and a
// commit whose outcome is unknown under its own outcome.
func TestTxMetricsCountDatabaseDuplicatesAndUnknownCommits(t *testing.T) {
	m := newMetered(t)
	h := m.handler("orders")
	db := newFakeDB()
	ctx := context.Background()
	if res, _ := DoTx(ctx, newFixture(t, true).handler("orders"), "o-1", db, effect("o-1")); res.Outcome != Processed {
		t.Fatal(res.Outcome)
	}
	if res, _ := DoTx(ctx, h, "o-1", db, effect("o-1")); res.Outcome != Duplicate || res.Tier != TierDatabase {
		t.Fatal(res.Outcome, res.Tier)
	}
	db.set(func(db *fakeDB) { db.unknownCommit = true })
	if res, _ := DoTx(ctx, h, "o-2", db, effect("o-2")); res.Outcome != CommitUnknown {
		t.Fatal(res.Outcome)
	}
	ms := m.collect()
	if got := sum(t, ms, "dedup.duplicates", handlerIs("orders"), attrTier.String("database")); got != 1 {
		t.Errorf("dedup.duplicates{database} = %d, want 1", got)
	}
	if got := sum(t, ms, "dedup.checks", handlerIs("orders"), attrOutcome.String("commit_unknown")); got != 1 {
		t.Errorf("dedup.checks{commit_unknown} = %d, want 1", got)
	}
}

// Committed runs' completions are lazy: runs that commit within batcher.LazyDelay of each
// other share one CompleteMany, where each would pay a round trip of its own.
func TestCommittedCompletionsShareRoundTrips(t *testing.T) {
	f := newFixture(t, true)
	h := f.handler("orders")
	db := newFakeDB()
	ctx := context.Background()
	const n = 10
	start := time.Now()
	for i := range n {
		if res, err := DoTx(ctx, h, fmt.Sprint("o-", i), db, effect(fmt.Sprint("o-", i))); res.Outcome != Processed {
			t.Fatal(res.Outcome, err)
		}
	}
	if time.Since(start) > batcher.LazyDelay {
		t.Skipf("%d runs took %v, longer than batcher.LazyDelay: nothing to share", n, time.Since(start))
	}
	testenv.Eventually(t, 5*time.Second, "every DONE", func() bool {
		for i := range n {
			if ans, _ := claim1(ctx, f.mem, h.RecordKey(fmt.Sprint("o-", i)), "probe", "", time.Minute); ans.Status != driver.StatusDuplicate {
				return false
			}
		}
		return true
	})
	if got := f.store.completes.Load(); got > 2 {
		t.Errorf("%d Complete calls for %d commits within %v; want them to share one or two", got, n, batcher.LazyDelay)
	}
}

// Close waits for the lazy completions of committed runs: they are not lost.
func TestCloseFlushesLazyCompletions(t *testing.T) {
	mem, _ := memstore.New()
	d, err := New(mem, WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	h, _ := d.Register("orders")
	db := newFakeDB()
	if res, _ := DoTx(context.Background(), h, "o-1", db, effect("o-1")); res.Outcome != Processed {
		t.Fatal(res.Outcome)
	}
	d.Close()
	if ans, _ := claim1(context.Background(), mem, h.RecordKey("o-1"), "probe", "", time.Minute); ans.Status != driver.StatusDuplicate {
		t.Fatalf("after Close: %v, want DONE", ans.Status)
	}
}

// A call for a key whose committed run's DONE record has not landed yet (it is lazy)
// answers Duplicate, not InProgress: the marker answers it. With the local tier off,
// nothing else in the process remembers the key.
func TestCallDuringALazyCompletionIsADuplicate(t *testing.T) {
	f := newFixture(t, true)
	h := f.handler("orders", WithLocalCache(0, 0))
	db := newFakeDB()
	for _, wait := range []bool{false, true} {
		key := fmt.Sprint("o-", wait)
		ctx := context.Background()
		if res, _ := DoTx(ctx, h, key, db, effect(key)); res.Outcome != Processed {
			t.Fatal(res.Outcome)
		}
		if wait {
			ctx = WaitForRunning(ctx)
		}
		res, err := DoTx(ctx, h, key, db, effect(key))
		if res.Outcome != Duplicate || err != nil {
			t.Errorf("WaitForRunning %v: the call right after the commit answered %v %v, want Duplicate", wait, res.Outcome, err)
		}
	}
	if db.effectsOf("o-false") != 1 || db.effectsOf("o-true") != 1 {
		t.Error("an effect ran twice")
	}
}

// A call for a key whose committed run's DONE record is still out, after a forget
// (here the local tier's purge, as when forget notices may have been lost), answers
// Duplicate from the marker: it does not answer InProgress for what is left of a
// lease that nothing holds (the outage benchmark's 30 s stall), nor wait for the
// store.
func TestCallAfterAForgetDuringALazyDoneWriteIsADuplicateAtOnce(t *testing.T) {
	f := newFixture(t, true)
	h := f.handler("orders", WithLease(30*time.Second))
	db := newFakeDB()
	held, release := make(chan struct{}, 1), make(chan struct{})
	f.store.onFail(func(op string) error {
		if op == "complete" {
			select {
			case held <- struct{}{}:
			default:
			}
			<-release
		}
		return nil
	})
	ctx := context.Background()
	if res, _ := DoTx(ctx, h, "k", db, effect("k")); res.Outcome != Processed {
		t.Fatal(res.Outcome)
	}
	<-held // the committed run's completion is out, and held
	h.purgeLocal()
	time.AfterFunc(100*time.Millisecond, func() { close(release) })
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := DoTx(cctx, h, "k", db, effect("k"))
	if res.Outcome != Duplicate || err != nil {
		t.Fatalf("the call after the forget answered %v (RetryAfter %v) %v, want Duplicate once the completion lands", res.Outcome, res.RetryAfter, err)
	}
	if took := time.Since(start); took > 50*time.Millisecond {
		t.Errorf("it took %v: it waited for the store", took)
	}
	if db.effectsOf("k") != 1 {
		t.Error("the effect ran twice")
	}
}

// A batch item whose key's committed run is still writing its DONE record (lazily,
// and held here) answers as a single call does: Duplicate, also after a forget (the
// local tier's purge), from the marker.
func TestBatchItemDuringALazyCompletion(t *testing.T) {
	for _, purge := range []bool{false, true} {
		mem, err := memstore.New()
		if err != nil {
			t.Fatal(err)
		}
		hold := &heldCompletions{Store: mem, key: ":k", held: make(chan struct{}, 1), release: make(chan struct{})}
		d, err := New(hold, WithLogger(quiet))
		if err != nil {
			t.Fatal(err)
		}
		opts := []HandlerOption{WithLocalCache(0, 0)} // nothing else in the process knows the key
		if purge {
			opts = nil // a local tier, purged: what the run learnt may predate a forget
		}
		h, _ := d.Register("orders", opts...)
		db := newFakeDB()
		ctx := context.Background()
		if res, _ := DoTx(ctx, h, "k", db, effect("k")); res.Outcome != Processed {
			t.Fatal(res.Outcome)
		}
		<-hold.held // its completion is out, and held
		if purge {
			h.purgeLocal()
		}
		items := []Item{{Key: "k"}, {Key: "other"}}
		rs := RunTx(ctx, h, items, Transactor[*fakeTx](db), func(_ context.Context, tx *fakeTx, i int) error {
			tx.write(items[i].Key)
			return nil
		})
		if rs[0].Outcome != Duplicate {
			t.Errorf("purge %v: the item of the key being completed answered %v (RetryAfter %v), want Duplicate", purge, rs[0].Outcome, rs[0].RetryAfter)
		}
		if rs[1].Outcome != Processed || db.effectsOf("k") != 1 {
			t.Errorf("the other item: %v; effects of k: %d", rs[1].Outcome, db.effectsOf("k"))
		}
		close(hold.release)
		d.Close()
	}
}

// heldCompletions holds each Complete of an entry whose key ends with key, until
// release is closed, telling held.
type heldCompletions struct {
	driver.Store
	key           string
	held, release chan struct{}
}

func (s *heldCompletions) Complete(ctx context.Context, entries []driver.Entry) ([]error, error) {
	for _, e := range entries {
		if strings.HasSuffix(e.Key, s.key) {
			s.held <- struct{}{}
			<-s.release
			break
		}
	}
	return s.Store.Complete(ctx, entries)
}

// Close ends a transactional run that waits at another process's marker (its
// Begin): Cancelled with ErrClosed, in DoTx and RunTx alike, and Close returns.
func TestCloseEndsATxRunWaitingAtTheMarker(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprint("batch ", batch), func(t *testing.T) {
			f := newFixture(t, true)
			a := f.handler("orders")
			other := newDeduperOver(t, f.store)
			b := other.mustRegister(t, "orders") // another process
			db := newFakeDB()
			ctx := context.Background()
			inFn, release := make(chan struct{}), make(chan struct{})
			aDone := make(chan struct{})
			go func() {
				defer close(aDone)
				_, _ = DoTx(ctx, a, "o-1", db, func(_ context.Context, tx *fakeTx) error { close(inFn); <-release; tx.write("o-1"); return nil })
			}()
			defer func() { close(release); <-aDone }()
			<-inFn
			bDone := make(chan ItemResult, 1)
			go func() {
				if batch {
					rs := RunTx(ctx, b, []Item{{Key: "o-1"}, {Key: "o-2"}}, db, func(context.Context, *fakeTx, int) error { return nil })
					bDone <- rs[0]
					return
				}
				r, err := DoTx(ctx, b, "o-1", db, effect("o-1"))
				bDone <- ItemResult{Result: r, Err: err}
			}()
			testenv.Eventually(t, 5*time.Second, "B waiting at A's marker", func() bool { return db.waiting() > 0 })
			closed := make(chan struct{})
			go func() { other.Close(); close(closed) }()
			select {
			case <-closed:
			case <-time.After(3 * time.Second):
				t.Fatal("Close still waits for the run at the marker after 3s")
			}
			if r := <-bDone; r.Outcome != Cancelled || !errors.Is(r.Err, ErrClosed) {
				t.Fatalf("B: %v %v, want Cancelled (ErrClosed)", r.Outcome, r.Err)
			}
		})
	}
}

// A committed run's DONE write that Close gives up on (the store does not answer) is
// logged, by key hash: the marker answers a redelivery, but an operator looking up
// the key in Redis finds nothing.
func TestADoneWriteCloseGivesUpOnIsLogged(t *testing.T) {
	mem, _ := memstore.New()
	hold := &heldCompletions{Store: mem, key: ":k", held: make(chan struct{}, 1), release: make(chan struct{})}
	defer close(hold.release)
	logs := &testenv.LogBuffer{}
	d, err := New(hold, WithLogger(slog.New(slog.NewJSONHandler(logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	h, _ := d.Register("orders")
	if res, err := DoTx(context.Background(), h, "k", newFakeDB(), effect("k")); res.Outcome != Processed {
		t.Fatal(res.Outcome, err)
	}
	<-hold.held
	start := time.Now()
	d.Close()
	if took := time.Since(start); took > 1500*time.Millisecond {
		t.Errorf("Close took %v", took)
	}
	if !strings.Contains(logs.String(), "DONE not written in the store by Close") {
		t.Fatalf("no log line for the DONE write Close gave up on:\n%s", logs.String())
	}
}
