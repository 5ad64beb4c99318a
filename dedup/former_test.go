package dedup

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// Former names are validated, and may not be the handler's own name or any name of
// another handler, whichever registers first.
func TestInvalidOrTakenFormerNamesAreRefused(t *testing.T) {
	mem, _ := memstore.New()
	for _, tc := range []struct {
		name   string
		first  func(d *Deduper) error // registered first, must succeed
		second func(d *Deduper) error // must fail with ErrInvalidOption
	}{
		{"bad name", nil, func(d *Deduper) error { _, err := d.Register("orders", WithFormerNames("bad name")); return err }},
		{"empty name", nil, func(d *Deduper) error { _, err := d.Register("orders", WithFormerNames("")); return err }},
		{"twice", nil, func(d *Deduper) error { _, err := d.Register("orders", WithFormerNames("old", "old")); return err }},
		{"own name", nil, func(d *Deduper) error { _, err := d.Register("orders", WithFormerNames("orders")); return err }},
		{"former is a handler registered before",
			func(d *Deduper) error { _, err := d.Register("orders"); return err },
			func(d *Deduper) error { _, err := d.Register("orders-v2", WithFormerNames("orders")); return err }},
		{"handler is a former name registered before",
			func(d *Deduper) error { _, err := d.Register("orders-v2", WithFormerNames("orders")); return err },
			func(d *Deduper) error { _, err := d.Register("orders"); return err }},
		{"former name of two handlers",
			func(d *Deduper) error { _, err := d.Register("a", WithFormerNames("old")); return err },
			func(d *Deduper) error { _, err := d.Register("b", WithFormerNames("x", "old")); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDeduper(t, mem)
			if tc.first != nil {
				if err := tc.first(d); err != nil {
					t.Fatal(err)
				}
			}
			err := tc.second(d)
			if !errors.Is(err, ErrInvalidOption) {
				t.Fatalf("err %v, want ErrInvalidOption", err)
			}
			t.Log(err)
		})
	}
}

// renamed is one store with a handler under its old name (in its own Deduper: a
// process not yet deployed) and the renamed handler (another Deduper).
type renamed struct {
	old, cur *Handler
	prefix   string
}

func newRenamed(t *testing.T, b backend, opts ...HandlerOption) renamed {
	old := register(t, newDeduper(t, b.store, WithPrefix(b.prefix)), "orders", opts...)
	cur := register(t, newDeduper(t, b.store, WithPrefix(b.prefix)), "orders-v2", append(opts, WithFormerNames("legacy", "orders"))...)
	return renamed{old: old, cur: cur, prefix: b.prefix}
}

// A DONE record under a former name answers Duplicate on every path (Do, Mark,
// Handle in both modes, HandleBatch, HandleBatchParallel), and fn does not run; new
// keys run and are written under the current name only; a claim answered by a
// former record copies it forward.
func TestDoneRecordUnderAFormerNameIsADuplicateOnEveryPath(t *testing.T) {
	type path struct {
		name string
		mode Mode
		run  func(ctx context.Context, h *Handler, key string, fn func(context.Context) error) Outcome
	}
	single := func(ctx context.Context, h *Handler, key string, fn func(context.Context) error) Outcome {
		res, _ := handleKey(h, ctx, key, []byte("p"), fn)
		return res.Outcome
	}
	batch := func(parallel int) func(ctx context.Context, h *Handler, key string, fn func(context.Context) error) Outcome {
		return func(ctx context.Context, h *Handler, key string, fn func(context.Context) error) Outcome {
			rs := h.Run(ctx, []Item{{Key: key, Payload: []byte("p")}, {Key: key + "-other", Payload: []byte("p")}},
				func(ctx context.Context, i int) error {
					if i == 0 {
						return fn(ctx)
					}
					return nil
				}, Parallel(parallel))
			return rs[0].Outcome
		}
	}
	paths := []path{
		{"do", ModeDo, func(ctx context.Context, h *Handler, key string, fn func(context.Context) error) Outcome {
			res, _ := h.Do(ctx, key, fn)
			return res.Outcome
		}},
		{"mark", ModeFilter, func(ctx context.Context, h *Handler, key string, fn func(context.Context) error) Outcome {
			res, _ := h.Mark(ctx, key)
			if res.Outcome == First {
				_ = fn(ctx)
			}
			return res.Outcome
		}},
		{"handle", ModeDo, single},
		{"handle-filter", ModeFilter, single},
		{"batch", ModeDo, batch(1)},
		{"batch-filter", ModeFilter, batch(1)},
		{"batch-parallel", ModeDo, batch(4)},
		{"batch-parallel-filter", ModeFilter, batch(4)},
	}
	for _, bf := range recordBackends() {
		t.Run(bf.name, func(t *testing.T) {
			t.Parallel()
			for _, p := range paths {
				t.Run(p.name, func(t *testing.T) {
					b := bf.new(t)
					ctx := context.Background()
					r := newRenamed(t, b, WithMode(p.mode), WithLocalCache(0, 0))
					var ran atomic.Int64
					fn := func(context.Context) error { ran.Add(1); return nil }
					if o := p.run(ctx, r.old, "order-1", fn); o != Processed && o != First {
						t.Fatalf("old name: %v", o)
					}
					ran.Store(0)
					if o := p.run(ctx, r.cur, "order-1", fn); o != Duplicate || ran.Load() != 0 {
						t.Fatalf("current name, key DONE under the former name: %v, fn ran %d times; want Duplicate, not run", o, ran.Load())
					}
					if o := p.run(ctx, r.cur, "order-2", fn); (o != Processed && o != First) || ran.Load() != 1 {
						t.Fatalf("a new key: %v, fn ran %d times", o, ran.Load())
					}
					if info, err := r.old.Lookup(ctx, "order-2"); err != nil || info.State != driver.RecordAbsent {
						t.Fatalf("a new key under the old name: %+v %v; want nothing written there", info, err)
					}
					own, err := r.cur.Lookup(ctx, "order-2")
					if err != nil || own.State != driver.RecordDone || own.Handler != "orders-v2" || own.RecordKey != r.cur.RecordKey("order-2") {
						t.Fatalf("a new key under the current name: %+v %v", own, err)
					}
					// the duplicate's record is copied forward (by the claim's completion,
					// or it is the mark's own): found under the current name now
					fwd, err := r.cur.LookupMany(ctx, []string{"order-1"})
					if err != nil || fwd[0].State != driver.RecordDone || fwd[0].Handler != "orders-v2" {
						t.Fatalf("copied forward: %+v %v", fwd, err)
					}
					if p.mode == ModeDo {
						oldInfo, _ := r.old.Lookup(ctx, "order-1")
						if fwd[0].TTL > oldInfo.TTL+50*time.Millisecond {
							t.Fatalf("copied forward for %v, longer than the former record's %v", fwd[0].TTL, oldInfo.TTL)
						}
					}
				})
			}
		})
	}
}

// A record IN PROGRESS under a former name (an instance still on the old name runs
// the message) answers InProgress, and the claim under the current name is given
// back; a DONE record with another fingerprint answers KeyReuse. Lookup and Forget
// see the former names' records.
func TestFormerNamesRecordsAnswerInProgressAndKeyReuse(t *testing.T) {
	for _, bf := range recordBackends() {
		t.Run(bf.name, func(t *testing.T) {
			t.Parallel()
			b := bf.new(t)
			ctx := context.Background()
			r := newRenamed(t, b, WithFingerprint(true), WithLease(time.Minute), WithLocalCache(0, 0))
			started, finish := make(chan struct{}), make(chan struct{})
			done := make(chan Result, 1)
			go func() {
				res, _ := handleKey(r.old, ctx, "order-1", []byte("a"), func(context.Context) error {
					close(started)
					<-finish
					return nil
				})
				done <- res
			}()
			<-started
			res, err := handleKey(r.cur, ctx, "order-1", []byte("a"), ok)
			want(t, res, err, InProgress)
			if res.RetryAfter <= 0 || res.RetryAfter > time.Minute {
				t.Fatalf("RetryAfter %v", res.RetryAfter)
			}
			info, err := r.cur.Lookup(ctx, "order-1")
			if err != nil || info.State != driver.RecordInProgress || info.Handler != "orders" {
				t.Fatalf("Lookup: %+v %v; want the former name's claim (its own was given back)", info, err)
			}
			if _, err := r.cur.Forget(ctx, "order-1"); !errors.Is(err, ErrRecordInProgress) {
				t.Fatalf("Forget: %v, want ErrRecordInProgress", err)
			}
			close(finish)
			if res := <-done; res.Outcome != Processed {
				t.Fatalf("old name's run: %v", res.Outcome)
			}
			res, err = handleKey(r.cur, ctx, "order-1", []byte("b"), ok)
			want(t, res, err, KeyReuse)
			res, err = handleKey(r.cur, ctx, "order-1", []byte("a"), ok)
			want(t, res, err, Duplicate)

			// Forget deletes under every name: the key runs again
			if info, err := r.cur.Forget(ctx, "order-1"); err != nil || info.State != driver.RecordDone {
				t.Fatalf("Forget: %+v %v", info, err)
			}
			for _, h := range []*Handler{r.old, r.cur} {
				if info, err := h.Lookup(ctx, "order-1"); err != nil || info.State != driver.RecordAbsent {
					t.Fatalf("%s after Forget: %+v %v", h.Name(), info, err)
				}
			}
			res, err = handleKey(r.cur, ctx, "order-1", []byte("b"), ok)
			want(t, res, err, Processed)
		})
	}
}

// A new key costs exactly one more round trip with former names than without (the
// lookup of the former records, one pipeline for a whole batch), on every path; a
// key answered by the current name's own record costs nothing more.
func TestFormerNamesCostANewKeyOneMoreRoundTrip(t *testing.T) {
	prefix := testenv.Prefix()
	c := testenv.Redis(t, prefix)
	tc := &testenv.TripCounter{}
	c.AddHook(tc)
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	d := newDeduper(t, s, WithPrefix(prefix))
	plain := register(t, d, "plain", WithLocalCache(0, 0))
	renamedDo := register(t, d, "renamed", WithLocalCache(0, 0), WithFormerNames("old-1", "old-2", "old-3"))
	plainF := register(t, d, "plain-filter", WithLocalCache(0, 0), WithMode(ModeFilter))
	renamedF := register(t, d, "renamed-filter", WithLocalCache(0, 0), WithMode(ModeFilter), WithFormerNames("old-4", "old-5", "old-6"))
	trips := func(run func()) int64 {
		tc.Reset()
		run()
		return tc.Trips()
	}
	n := 0
	key := func() string { n++; return fmt.Sprintf("k%d", n) }
	// warm the script caches (a duplicate's claim goes to the claim script: a server
	// of the test's own has not loaded it yet), and the store's probe of the server
	// (its first batch call asks INFO once)
	for _, h := range []*Handler{plain, renamedDo} {
		k := key()
		res, err := h.Do(ctx, k, ok)
		want(t, res, err, Processed)
		res, err = h.Do(ctx, k, ok)
		want(t, res, err, Duplicate)
	}
	plain.Run(ctx, []Item{{Key: key()}, {Key: key()}}, func(context.Context, int) error { return nil }) // a batch: one of one is a single call
	// A batch's completions go out as its fns return, coalesced as they come: its
	// checks are the round trips made before its first fn runs.
	batchChecks := func(h *Handler) int64 {
		items := make([]Item, 20)
		for i := range items {
			items[i].Key = key()
		}
		var first atomic.Bool
		var before int64
		tc.Reset()
		h.Run(ctx, items, func(context.Context, int) error {
			if first.CompareAndSwap(false, true) {
				before = tc.Trips()
			}
			return nil
		})
		return before
	}
	for _, c := range []struct {
		name           string
		plain, renamed *Handler
		trips          func(h *Handler) int64
	}{
		{"do", plain, renamedDo, func(h *Handler) int64 { return trips(func() { h.Do(ctx, key(), ok) }) }},
		{"mark", plainF, renamedF, func(h *Handler) int64 { return trips(func() { h.Mark(ctx, key()) }) }},
		{"batch", plain, renamedDo, batchChecks},
		{"batch-filter", plainF, renamedF, batchChecks},
	} {
		base, with := c.trips(c.plain), c.trips(c.renamed)
		if with != base+1 {
			t.Fatalf("%s: %d round trips with former names, %d without; want 1 more", c.name, with, base)
		}
		t.Logf("%s, new keys: %d round trips without former names, %d with", c.name, base, with)
	}
	// a key DONE under the current name is answered by its record: nothing more
	k := key()
	for _, h := range []*Handler{plain, renamedDo} {
		res, err := h.Do(ctx, k, ok)
		want(t, res, err, Processed)
	}
	base := trips(func() { res, err := plain.Do(ctx, k, ok); want(t, res, err, Duplicate) })
	if with := trips(func() { res, err := renamedDo.Do(ctx, k, ok); want(t, res, err, Duplicate) }); with != base {
		t.Fatalf("a duplicate under the current name: %d round trips, %d without former names", with, base)
	}
	// a key DONE under a former name: the claim, the lookup and the copy forward;
	// then, copied forward, it costs what a duplicate under the current name does
	old := register(t, newDeduper(t, s, WithPrefix(prefix)), "old-2", WithLocalCache(0, 0)) // another process
	k = key()
	res, err := old.Do(ctx, k, ok)
	want(t, res, err, Processed)
	if n := trips(func() { res, err := renamedDo.Do(ctx, k, ok); want(t, res, err, Duplicate) }); n != 3 {
		t.Fatalf("a duplicate under a former name: %d round trips, want 3", n)
	}
	if n := trips(func() { res, err := renamedDo.Do(ctx, k, ok); want(t, res, err, Duplicate) }); n != base {
		t.Fatalf("the same, copied forward: %d round trips, want %d", n, base)
	}
}

// A transactional run of a renamed handler claims nothing, but reads its key's
// records under the former names first (one round trip, the marker guarding the
// rest): DONE there answers Duplicate without running fn, in DoTx and RunTx alike;
// IN PROGRESS there answers InProgress; a new key runs and commits once. With the
// former names unreadable it fails closed: such a record may hold the key DONE.
func TestTransactionalRunsOfARenamedHandlerReadTheFormerNames(t *testing.T) {
	for _, bf := range recordBackends() {
		t.Run(bf.name, func(t *testing.T) {
			t.Parallel()
			b := bf.new(t)
			ctx := context.Background()
			r := newRenamed(t, b, WithLocalCache(0, 0), WithLease(time.Minute))
			db := newFakeDB()
			var ran atomic.Int64
			work := func(key string) func(context.Context, *fakeTx) error {
				return func(_ context.Context, tx *fakeTx) error { ran.Add(1); tx.write(key); return nil }
			}
			for _, k := range []string{"order-1", "order-2"} {
				if res, err := r.old.Do(ctx, k, func(context.Context) error { return nil }); res.Outcome != Processed {
					t.Fatal(res.Outcome, err)
				}
			}
			started, finish := make(chan struct{}), make(chan struct{})
			go func() { // order-3 in progress under the old name
				_, _ = r.old.Do(ctx, "order-3", func(context.Context) error { close(started); <-finish; return nil })
			}()
			<-started
			defer close(finish)
			if res, err := DoTx(ctx, r.cur, "order-1", db, work("order-1")); res.Outcome != Duplicate || res.Tier != TierStore || err != nil {
				t.Fatalf("DoTx, DONE under a former name: %v %v %v", res.Outcome, res.Tier, err)
			}
			rs := RunTx(ctx, r.cur, []Item{{Key: "order-2"}, {Key: "order-3"}, {Key: "order-4"}}, db, func(ctx context.Context, tx *fakeTx, i int) error {
				return work(fmt.Sprint("order-", i+2))(ctx, tx)
			})
			if rs[0].Outcome != Duplicate || rs[1].Outcome != InProgress || rs[2].Outcome != Processed {
				t.Fatalf("RunTx: %v %v %v; want Duplicate, InProgress, Processed", rs[0].Outcome, rs[1].Outcome, rs[2].Outcome)
			}
			if ran.Load() != 1 || db.effectsOf("order-4") != 1 {
				t.Fatalf("fn ran %d times, effects of order-4 %d; want once", ran.Load(), db.effectsOf("order-4"))
			}
		})
	}
	for _, p := range []StoreFailurePolicy{FailClosed, FailOpen} {
		t.Run(fmt.Sprint("former names unreadable, policy ", p), func(t *testing.T) {
			mem, _ := memstore.New()
			d := newDeduper(t, unreadable{mem})
			h := register(t, d, "orders-v2", WithFormerNames("orders"), WithLocalCache(0, 0), WithStoreFailure(p))
			db := newFakeDB()
			res, err := DoTx(context.Background(), h, "k", db, effect("k"))
			if res.Outcome != StoreUnavailable || !errors.Is(err, ErrStoreUnavailable) || db.effectsOf("k") != 0 {
				t.Fatalf("%v %v, effects %d; want StoreUnavailable, not run", res.Outcome, err, db.effectsOf("k"))
			}
		})
	}
}

// unreadable is a store whose records cannot be looked up.
type unreadable struct{ *memstore.Store }

func (u unreadable) Lookup(context.Context, []string) ([]driver.Record, error) {
	return nil, fmt.Errorf("%w: lookup: injected", ErrStoreUnavailable)
}
