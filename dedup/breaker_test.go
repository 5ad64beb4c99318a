package dedup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/internal/batcher"
	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// Once the store has failed batcher.BreakerTrip times in a row, claims and marks fail at
// once, without a store call: a FailOpen handler runs unguarded, a FailClosed one
// answers StoreUnavailable, and a transactional handler, which claims nothing, runs on
// its marker throughout. A probe closes the breaker once the store answers again, and
// claims go to the store again. Nothing runs twice throughout.
func TestBreakerSkipsAStoreKnownDownAndProbesItBack(t *testing.T) {
	mem, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	hs := &hookStore{Store: mem}
	down := func(on bool) {
		if !on {
			hs.fail.Store(nil)
			return
		}
		hs.onFail(func(op string) error {
			time.Sleep(20 * time.Millisecond) // a client waiting out its retries
			return fmt.Errorf("%w: %s: injected outage", ErrStoreUnavailable, op)
		})
	}
	d, err := New(hs, WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	tx, _ := d.Register("tx")
	open, _ := d.Register("open", WithStoreFailure(FailOpen))
	closed, _ := d.Register("closed")
	db := newFakeDB()
	ctx := context.Background()
	run := func(key string) Result {
		t.Helper()
		res, err := DoTx(ctx, tx, key, Transactor[*fakeTx](db), func(_ context.Context, tx *fakeTx) error {
			tx.write(key)
			return nil
		})
		if err != nil && res.Outcome != Processed {
			t.Fatalf("%s: %v %v", key, res.Outcome, err)
		}
		return res
	}
	run("before")
	if d.Breaker() {
		t.Fatal("breaker open while the store answers")
	}

	down(true)
	for i := range batcher.BreakerTrip {
		// each waits for the store, fails, and runs unguarded
		if res, _ := open.Do(ctx, fmt.Sprint("trip-", i), func(context.Context) error { return nil }); !res.Unguarded {
			t.Fatalf("trip-%d, store down: %+v", i, res)
		}
		run(fmt.Sprint("trip-", i)) // on its marker, without waiting for the store
	}
	if !d.Breaker() {
		t.Fatalf("breaker closed after %d failures in a row", batcher.BreakerTrip)
	}
	claims := hs.claims.Load()
	start := time.Now()
	for i := range 20 {
		if res := run(fmt.Sprint("down-", i)); res.Outcome != Processed {
			t.Fatalf("down-%d: %v", i, res.Outcome)
		}
	}
	if res, err := open.Do(ctx, "o", func(context.Context) error { return nil }); res.Outcome != Processed || !res.Unguarded || err != nil {
		t.Fatalf("FailOpen while the breaker is open: %+v %v", res, err)
	}
	if res, err := closed.Do(ctx, "c", func(context.Context) error { return nil }); res.Outcome != StoreUnavailable || !errors.Is(err, batcher.ErrBreakerOpen) {
		t.Fatalf("FailClosed while the breaker is open: %+v %v", res, err)
	}
	if n := hs.claims.Load() - claims; n != 0 {
		t.Fatalf("%d claims reached the store while the breaker was open", n)
	}
	t.Logf("22 runs with the breaker open took %v", time.Since(start))
	if res := run("down-3"); res.Outcome != Duplicate {
		t.Fatalf("a committed key again, store down: %+v", res)
	}

	down(false)
	testenv.Eventually(t, 5*time.Second, "the breaker closes", func() bool { return !d.Breaker() })
	claims = hs.claims.Load()
	if res := run("after"); res.Outcome != Processed {
		t.Fatalf("after: %v", res.Outcome)
	}
	if res, err := closed.Do(ctx, "c", func(context.Context) error { return nil }); res.Outcome != Processed || err != nil {
		t.Fatalf("FailClosed once the store is back: %+v %v", res, err)
	}
	if n := hs.claims.Load() - claims; n != 1 {
		t.Fatalf("%d claims reached the store once it was back, want 1 (FailClosed's; DoTx claims nothing)", n)
	}
	for _, k := range []string{"before", "trip-0", "down-0", "down-3", "down-19", "after"} {
		if n := db.effectsOf(k); n != 1 {
			t.Errorf("%s: %d effects, want 1", k, n)
		}
	}
}

// A store that answers resets the count: failures spread between successes never
// open the breaker.
func TestBreakerNeedsFailuresInARow(t *testing.T) {
	mem, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	hs := &hookStore{Store: mem}
	d, err := New(hs, WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	h, _ := d.Register("h")
	ctx := context.Background()
	n := 0
	hs.onFail(func(op string) error {
		if op != "claim" {
			return nil
		}
		n++
		if n%batcher.BreakerTrip == 0 {
			return nil
		}
		return fmt.Errorf("%w: injected", ErrStoreUnavailable)
	})
	for i := range 10 * batcher.BreakerTrip {
		_, _ = h.Do(ctx, fmt.Sprint("k", i), func(context.Context) error { return nil })
		if d.Breaker() {
			t.Fatalf("breaker open after call %d, with a success every %d", i, batcher.BreakerTrip)
		}
	}
}

// A claim still waiting for the store when the breaker opens gives up then, instead
// of waiting out the client's retries.
func TestBreakerOpeningEndsTheClaimsStillWaiting(t *testing.T) {
	mem, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	hs := &hookStore{Store: mem}
	stuck := make(chan struct{})
	defer close(stuck)
	hs.onFail(func(op string) error { // every call, the probe's too: the breaker stays open
		return fmt.Errorf("%w: injected", ErrStoreUnavailable)
	})
	slow := &slowClaims{Store: hs, key: "slow", stuck: stuck}
	d, err := New(slow, WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	h, _ := d.Register("h")
	ctx := context.Background()
	noop := func(context.Context) error { return nil }
	out := make(chan Result, 1)
	go func() {
		res, _ := h.Do(ctx, "slow", noop)
		out <- res
	}()
	testenv.Eventually(t, 5*time.Second, "the slow claim is out", func() bool { return slow.out.Load() })
	for i := range batcher.BreakerTrip {
		if res, _ := h.Do(ctx, fmt.Sprint("k", i), noop); res.Outcome != StoreUnavailable {
			t.Fatalf("k%d: %v", i, res.Outcome)
		}
	}
	select {
	case res := <-out:
		if res.Outcome != StoreUnavailable {
			t.Fatalf("the waiting claim: %v", res.Outcome)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting claim did not give up when the breaker opened")
	}
}

// slowClaims holds the claim of key (every claim, for key "") until stuck is closed.
type slowClaims struct {
	driver.Store
	key   string
	stuck chan struct{}
	out   atomic.Bool
}

func (s *slowClaims) Claim(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	for _, e := range entries {
		if s.key == "" || strings.HasSuffix(e.Key, ":"+s.key) {
			s.out.Store(true)
			<-s.stuck
		}
	}
	return s.Store.Claim(ctx, entries)
}

// Claims the store never answers open the breaker by themselves, though their
// callers set no deadline: each counts as a failure once it has waited
// batcher.StallAfter (a client waiting out its dial retries answers nothing for
// seconds). Then they give up, and a FailOpen handler runs them unguarded; the claims
// that land later are given back.
func TestClaimsTheStoreDoesNotAnswerOpenTheBreaker(t *testing.T) {
	mem, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	stuck := make(chan struct{})
	hung := &slowClaims{Store: mem, stuck: stuck} // every key
	d, err := New(hung, WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	open, _ := d.Register("open", WithStoreFailure(FailOpen))
	var ran [batcher.BreakerTrip]atomic.Int64
	out := make(chan Result, batcher.BreakerTrip)
	for i := range batcher.BreakerTrip {
		go func() {
			res, _ := open.Do(context.Background(), fmt.Sprint("k", i), func(context.Context) error {
				ran[i].Add(1)
				return nil
			})
			out <- res
		}()
	}
	for range batcher.BreakerTrip {
		select {
		case res := <-out:
			if res.Outcome != Processed || !res.Unguarded {
				t.Errorf("a claim the store did not answer: %+v, want Processed unguarded", res)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("claims the store does not answer kept their callers waiting: the breaker did not open")
		}
	}
	close(stuck) // the claims land now, for nobody: they are given back
	for i := range batcher.BreakerTrip {
		key := fmt.Sprint("k", i)
		if n := ran[i].Load(); n != 1 {
			t.Errorf("%s: ran %d times", key, n)
		}
		testenv.Eventually(t, 5*time.Second, key+" given back", func() bool {
			recs, err := mem.Lookup(context.Background(), []string{open.RecordKey(key)})
			return err == nil && recs[0].State == driver.RecordAbsent
		})
	}
}

// A transactional run claims nothing: against a store whose claims hang, it commits
// on its marker long before its deadline (it was once Cancelled at the deadline
// without running).
func TestATxRunDoesNotWaitForAStoreThatDoesNotAnswer(t *testing.T) {
	mem, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	hung := &slowClaims{Store: mem, stuck: make(chan struct{})}
	d, err := New(hung, WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	defer close(hung.stuck) // before Close: the claim lands for nobody and is given back
	tx, _ := d.Register("tx")
	db := newFakeDB()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := DoTx(ctx, tx, "k", Transactor[*fakeTx](db), func(_ context.Context, t *fakeTx) error {
		t.write("k")
		return nil
	})
	if res.Outcome != Processed || err != nil || ctx.Err() != nil || db.effectsOf("k") != 1 {
		t.Fatalf("%v %v (context: %v), %d effects; want Processed on the marker, before the deadline", res.Outcome, err, ctx.Err(), db.effectsOf("k"))
	}
}
