package dedup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/dedup/storetest"
	"github.com/dedupkit/dedupkit/internal/storekit"
	"github.com/dedupkit/dedupkit/internal/testenv"
	"github.com/dedupkit/dedupkit/keys"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type fixture struct {
	t     *testing.T
	clk   *storetest.Clock // nil when the memory store runs on the real clock
	mem   *memstore.Store
	store *hookStore
	d     *Deduper
}

// newFixture builds a Deduper over a counting memory store. realClock selects the
// real clock, for tests whose heartbeats must meet the store's expiry.
func newFixture(t *testing.T, realClock bool) *fixture {
	t.Helper()
	f := &fixture{t: t}
	opts := []memstore.Option{}
	if !realClock {
		f.clk = storetest.NewClock()
		opts = append(opts, memstore.WithClock(f.clk.Now))
	}
	mem, err := memstore.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	f.mem = mem
	f.store = &hookStore{Store: mem}
	d, err := New(f.store, WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	f.d = d
	t.Cleanup(func() { d.Close() })
	return f
}

func (f *fixture) handler(name string, opts ...HandlerOption) *Handler {
	f.t.Helper()
	h, err := f.d.Register(name, opts...)
	if err != nil {
		f.t.Fatal(err)
	}
	return h
}

func want(t *testing.T, res Result, err error, o Outcome) {
	t.Helper()
	if res.Outcome != o {
		t.Fatalf("outcome %v (err %v), want %v", res.Outcome, err, o)
	}
}

func ok(context.Context) error { return nil }

func TestDoProcessedThenDuplicate(t *testing.T) {
	f := newFixture(t, false)
	h := f.handler("orders")
	runs := 0
	fn := func(context.Context) error { runs++; return nil }
	ctx := context.Background()

	res, err := h.Do(ctx, "order-1", fn)
	want(t, res, err, Processed)
	if err != nil {
		t.Fatal(err)
	}
	res, err = h.Do(ctx, "order-1", fn)
	want(t, res, err, Duplicate)
	if res.Tier != TierLocal || err != nil {
		t.Fatalf("tier %v err %v, want local", res.Tier, err)
	}
	// a second process (no local tier of its own) learns it from the store
	other := newDeduperOver(t, f.store).mustRegister(t, "orders")
	res, err = other.Do(ctx, "order-1", fn)
	want(t, res, err, Duplicate)
	if res.Tier != TierStore {
		t.Fatalf("tier %v, want store", res.Tier)
	}
	if runs != 1 {
		t.Fatalf("fn ran %d times", runs)
	}
	if c := f.store.claims.Load(); c != 2 {
		t.Fatalf("%d claims, want 2 (the local hit makes none)", c)
	}
	st := h.Stats()
	if st.Count(Processed) != 1 || st.Count(Duplicate) != 1 || st.LocalDuplicates != 1 {
		t.Fatalf("stats %+v", st)
	}
}

type deduper struct{ *Deduper }

func newDeduperOver(t *testing.T, s driver.Store) deduper {
	d, err := New(s, WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return deduper{d}
}

func (d deduper) mustRegister(t *testing.T, name string, opts ...HandlerOption) *Handler {
	h, err := d.Register(name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestHandlersAreIndependent(t *testing.T) {
	f := newFixture(t, false)
	inv := f.handler("inventory", WithRetention(time.Hour))
	mail := f.handler("email", WithRetention(10*time.Minute))
	ctx := context.Background()
	for _, h := range []*Handler{inv, mail} {
		res, err := h.Do(ctx, "msg-1", ok)
		want(t, res, err, Processed)
	}
	// each keeps its own retention
	f.clk.Add(10*time.Minute + time.Second)
	inv2 := newDeduperOver(t, f.store).mustRegister(t, "inventory")
	mail2 := newDeduperOver(t, f.store).mustRegister(t, "email")
	res, err := inv2.Do(ctx, "msg-1", ok)
	want(t, res, err, Duplicate)
	res, err = mail2.Do(ctx, "msg-1", ok)
	want(t, res, err, Processed)
	if inv.RecordKey("msg-1") == mail.RecordKey("msg-1") {
		t.Fatal("two handlers share a record key")
	}
}

func TestDoAnswersInProgressWithTheLeaseLeftWhenClaimedElsewhere(t *testing.T) {
	f := newFixture(t, false)
	h := f.handler("orders", WithLease(time.Minute))
	ctx := context.Background()
	if _, err := claim1(ctx, f.mem, h.RecordKey("k"), "someone-else", "", time.Minute); err != nil {
		t.Fatal(err)
	}
	f.clk.Add(20 * time.Second)
	res, err := h.Do(ctx, "k", func(context.Context) error { t.Fatal("fn ran"); return nil })
	want(t, res, err, InProgress)
	if err != nil || res.RetryAfter != 40*time.Second {
		t.Fatalf("retry after %v (err %v), want 40s", res.RetryAfter, err)
	}
}

func TestDoHandlerErrorReleasesAndSkipsLocalTier(t *testing.T) {
	f := newFixture(t, false)
	h := f.handler("orders")
	ctx := context.Background()
	boom := errors.New("boom")
	res, err := h.Do(ctx, "k", func(context.Context) error { return boom })
	want(t, res, err, Failed)
	if err != boom {
		t.Fatalf("err %v, want the handler's error as is", err)
	}
	if f.store.releases.Load() != 1 {
		t.Fatal("claim not released")
	}
	// the retry reaches the store (the local tier holds DONE keys only) and runs fn
	ran := false
	res, err = h.Do(ctx, "k", func(context.Context) error { ran = true; return nil })
	want(t, res, err, Processed)
	if !ran || f.store.claims.Load() != 2 {
		t.Fatalf("retry ran=%v claims=%d", ran, f.store.claims.Load())
	}
}

func TestDoPanicReleases(t *testing.T) {
	f := newFixture(t, false)
	h := f.handler("orders")
	ctx := context.Background()
	res, err := h.Do(ctx, "k", func(context.Context) error { panic("kaboom") })
	want(t, res, err, Panicked)
	if !errors.Is(err, ErrPanic) || !strings.Contains(err.Error(), "kaboom") {
		t.Fatalf("err %v", err)
	}
	res, err = h.Do(ctx, "k", ok)
	want(t, res, err, Processed)
	if h.Stats().Count(Panicked) != 1 {
		t.Fatal("panic not counted")
	}
}

func TestAnotherPayloadUnderAKnownKeyIsKeyReuse(t *testing.T) {
	f := newFixture(t, false)
	h := f.handler("orders", WithFingerprint(true), WithKeyStrategy(keys.Header("Idempotency-Key")))
	ctx := context.Background()
	msg := func(body string) keys.Message {
		return keys.Raw{Headers: map[string]string{"Idempotency-Key": "pay-7"}, Body: []byte(body)}
	}
	res, err := h.Handle(ctx, msg("charge 10"), ok)
	want(t, res, err, Processed)
	res, err = h.Handle(ctx, msg("charge 10"), ok)
	want(t, res, err, Duplicate)
	// another payload under the same key is not a silent duplicate, even though the
	// key is in the local tier
	res, err = h.Handle(ctx, msg("charge 99"), func(context.Context) error { t.Fatal("fn ran"); return nil })
	want(t, res, err, KeyReuse)
	if err != nil || h.Stats().Count(KeyReuse) != 1 {
		t.Fatalf("err %v stats %+v", err, h.Stats())
	}
	// filter mode too
	fh := f.handler("audit", WithFingerprint(true), WithMode(ModeFilter), WithKeyStrategy(keys.Header("Idempotency-Key")))
	res, err = fh.Handle(ctx, msg("a"), ok)
	want(t, res, err, Processed)
	res, err = fh.Handle(ctx, msg("b"), ok)
	want(t, res, err, KeyReuse)
}

func TestHeartbeatKeepsLease(t *testing.T) {
	f := newFixture(t, true)
	lease := 120 * time.Millisecond
	h := f.handler("slow", WithLease(lease))
	rival := newDeduperOver(t, f.store).mustRegister(t, "slow", WithLease(lease))
	ctx := context.Background()
	var rivalSaw []Outcome
	res, err := h.Do(ctx, "k", func(ctx context.Context) error {
		for i := 0; i < 5; i++ { // 5 × lease: the record would have expired 4 times over
			time.Sleep(lease)
			r, _ := rival.Do(ctx, "k", func(context.Context) error { t.Error("rival ran"); return nil })
			rivalSaw = append(rivalSaw, r.Outcome)
		}
		return ctx.Err()
	})
	want(t, res, err, Processed)
	for _, o := range rivalSaw {
		if o != InProgress {
			t.Fatalf("rival saw %v", rivalSaw)
		}
	}
	// every lease/3 over 5 leases is about 15 extensions
	if n := f.store.extends.Load(); n < 10 {
		t.Fatalf("%d extensions in 5 leases, want about 15", n)
	}
}

func TestLostLeaseCancelsHandler(t *testing.T) {
	f := newFixture(t, false)
	lease := 90 * time.Millisecond
	h := f.handler("slow", WithLease(lease))
	ctx := context.Background()
	started := make(chan struct{})
	var cause error
	go func() {
		<-started
		// the lease runs out (store time) and another owner claims the key
		f.clk.Add(2 * lease)
		if a, err := claim1(ctx, f.mem, h.RecordKey("k"), "thief", "", time.Minute); err != nil || a.Status != driver.StatusAcquired {
			t.Errorf("thief: %v %v", a, err)
		}
	}()
	res, err := h.Do(ctx, "k", func(ctx context.Context) error {
		close(started)
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
			return ctx.Err()
		case <-time.After(5 * time.Second):
			return errors.New("not cancelled")
		}
	})
	want(t, res, err, LeaseLost)
	if !errors.Is(cause, ErrLeaseLost) || !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("cause %v err %v", cause, err)
	}
	if h.Stats().HeartbeatLeaseLost != 1 {
		t.Fatal("lease loss not counted")
	}
	// the thief's claim is untouched
	if a, _ := claim1(ctx, f.mem, h.RecordKey("k"), "thief", "", time.Minute); a.Status != driver.StatusAcquired {
		t.Fatalf("thief lost its claim: %v", a)
	}
}

func TestCompleteFailureIsReportedDistinctly(t *testing.T) {
	f := newFixture(t, false)
	h := f.handler("orders")
	down := errors.New("connection refused")
	f.store.onFail(func(op string) error {
		if op == "complete" {
			return fmt.Errorf("%w: %w", ErrStoreUnavailable, down)
		}
		return nil
	})
	res, err := h.Do(context.Background(), "k", ok)
	want(t, res, err, NotRecorded)
	if !errors.Is(err, ErrNotRecorded) || !errors.Is(err, down) {
		t.Fatalf("err %v", err)
	}
}

// A completion the store did not answer is sent again until it lands: after a short
// outage DONE is written, and a redelivery after the claim's lease is a Duplicate,
// not a second run.
func TestAFailedCompletionLandsOnceTheStoreAnswers(t *testing.T) {
	f := newFixture(t, false)
	h := f.handler("orders")
	ctx := context.Background()
	var down atomic.Bool
	down.Store(true)
	f.store.onFail(func(op string) error {
		if op == "complete" && down.Load() {
			return fmt.Errorf("%w: connection refused", ErrStoreUnavailable)
		}
		return nil
	})
	res, err := h.Do(ctx, "k", ok)
	want(t, res, err, NotRecorded)
	down.Store(false)
	testenv.Eventually(t, 5*time.Second, "DONE written on a retry", func() bool {
		rs, err := f.mem.Lookup(ctx, []string{h.RecordKey("k")})
		return err == nil && rs[0].State == driver.RecordDone
	})
	f.clk.Add(h.cfg.lease + time.Second) // the claim alone would have lapsed by now
	res, err = h.Do(ctx, "k", func(context.Context) error { t.Fatal("ran twice"); return nil })
	want(t, res, err, Duplicate)
}

// An InProgress answered by a run of this process says so (TierLocal), as
// Result.Tier's doc has it; one answered by another owner's claim says TierStore.
func TestInProgressSaysWhereTheRunWasSeen(t *testing.T) {
	f := newFixture(t, false)
	h := f.handler("orders")
	ctx := context.Background()
	started, finish := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = h.Do(ctx, "k", func(context.Context) error { close(started); <-finish; return nil })
	}()
	<-started
	res, err := h.Do(ctx, "k", ok)
	want(t, res, err, InProgress)
	items := h.Run(ctx, []Item{{Key: "k"}}, func(context.Context, int) error { return nil })
	close(finish)
	<-done
	if res.Tier != TierLocal || items[0].Outcome != InProgress || items[0].Tier != TierLocal {
		t.Fatalf("Do: %v, Run: %v %v; want InProgress, TierLocal", res.Tier, items[0].Outcome, items[0].Tier)
	}
	other := newDeduperOver(t, f.store).mustRegister(t, "orders")
	if _, err := claim1(ctx, f.mem, h.RecordKey("busy"), "someone", "", time.Minute); err != nil {
		t.Fatal(err)
	}
	if res, err := other.Do(ctx, "busy", ok); res.Outcome != InProgress || res.Tier != TierStore {
		t.Fatalf("another owner's claim: %v %v (%v)", res.Outcome, res.Tier, err)
	}
}

// Close ends the retries of completions the store never answers: none is sent after
// it returns.
func TestCloseEndsTheRetriesOfCompletions(t *testing.T) {
	f := newFixture(t, false)
	h := f.handler("orders")
	f.store.onFail(func(op string) error {
		if op == "complete" {
			return fmt.Errorf("%w: connection refused", ErrStoreUnavailable)
		}
		return nil
	})
	res, err := h.Do(context.Background(), "k", ok)
	want(t, res, err, NotRecorded)
	testenv.Eventually(t, 5*time.Second, "retried", func() bool { return f.store.completes.Load() >= 3 })
	if err := f.d.Close(); err != nil {
		t.Fatal(err)
	}
	n := f.store.completes.Load()
	time.Sleep(300 * time.Millisecond) // several retry intervals
	if m := f.store.completes.Load(); m != n {
		t.Fatalf("%d completions sent after Close", m-n)
	}
}

func TestStoreDownFailsClosedOrRunsUnguarded(t *testing.T) {
	down := fmt.Errorf("%w: dial tcp: connection refused", ErrStoreUnavailable)
	ctx := context.Background()
	t.Run("fail-closed", func(t *testing.T) {
		f := newFixture(t, false)
		f.store.onFail(func(string) error { return down })
		h := f.handler("orders")
		res, err := h.Do(ctx, "k", func(context.Context) error { t.Fatal("fn ran"); return nil })
		want(t, res, err, StoreUnavailable)
		if !errors.Is(err, ErrStoreUnavailable) {
			t.Fatalf("err %v", err)
		}
		res, err = h.Mark(ctx, "k")
		want(t, res, err, StoreUnavailable)
	})
	t.Run("fail-open", func(t *testing.T) {
		f := newFixture(t, false)
		f.store.onFail(func(string) error { return down })
		h := f.handler("orders", WithStoreFailure(FailOpen))
		ran := false
		res, err := h.Do(ctx, "k", func(context.Context) error { ran = true; return nil })
		want(t, res, err, Processed)
		if !ran || !res.Unguarded || err != nil {
			t.Fatalf("ran %v unguarded %v err %v", ran, res.Unguarded, err)
		}
		res, err = h.Mark(ctx, "k2")
		want(t, res, err, First)
		if !res.Unguarded || h.Stats().Unguarded != 2 {
			t.Fatalf("unguarded %v stats %+v", res.Unguarded, h.Stats())
		}
	})
}

func TestMissingKeyIsNoKeyOrRunsUnguarded(t *testing.T) {
	f := newFixture(t, false)
	ctx := context.Background()
	empty := keys.Raw{Body: []byte("x")}
	reject := f.handler("strict")
	res, err := reject.Handle(ctx, empty, func(context.Context) error { t.Fatal("fn ran"); return nil })
	want(t, res, err, NoKey)
	res, err = reject.Do(ctx, "", func(context.Context) error { t.Fatal("fn ran"); return nil })
	want(t, res, err, NoKey)
	process := f.handler("lenient", WithMissingKey(ProcessMissingKey))
	ran := false
	res, err = process.Handle(ctx, empty, func(context.Context) error { ran = true; return nil })
	want(t, res, err, Processed)
	if !ran || !res.Unguarded {
		t.Fatal("missing key not processed unguarded")
	}
	if f.store.claims.Load()+f.store.marks.Load() != 0 {
		t.Fatal("a keyless message reached the store")
	}
}

func TestFilterModeIsOneRoundTrip(t *testing.T) {
	f := newFixture(t, false)
	h := f.handler("metrics", WithMode(ModeFilter), WithLocalCache(0, 0))
	ctx := context.Background()
	res, err := h.Mark(ctx, "k")
	want(t, res, err, First)
	res, err = h.Mark(ctx, "k")
	want(t, res, err, Duplicate)
	msg := keys.Raw{Headers: map[string]string{"Nats-Msg-Id": "m1"}}
	res, err = h.Handle(ctx, msg, ok)
	want(t, res, err, Processed)
	calls := f.store.marks.Load() + f.store.claims.Load() + f.store.completes.Load() + f.store.extends.Load() + f.store.releases.Load()
	if f.store.marks.Load() != 3 || calls != 3 {
		t.Fatalf("%d store calls (%d marks) for 3 checks, want one mark each", calls, f.store.marks.Load())
	}
}

func TestShutdownMidHandlerReleases(t *testing.T) {
	f := newFixture(t, false)
	h := f.handler("orders")
	ctx, cancel := context.WithCancel(context.Background())
	res, err := h.Do(ctx, "k", func(ctx context.Context) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	})
	want(t, res, err, Cancelled)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
	// released: another consumer can take the message now
	if a, _ := claim1(context.Background(), f.mem, h.RecordKey("k"), "next", "", time.Minute); a.Status != driver.StatusAcquired {
		t.Fatalf("claim after shutdown: %v", a.Status)
	}
}

// TestCancelledCallsRecordNothing: a call whose context has ended before it starts
// answers Cancelled, on the memory store as on Redis, and leaves the key free: the
// redelivery runs. The memory store once recorded the Mark (and the claim) anyway, so
// the redelivery was a Duplicate and the message was lost.
func TestCancelledCallsRecordNothing(t *testing.T) {
	mem, _ := memstore.New()
	d := newDeduperOver(t, mem)
	filter, do := d.mustRegister(t, "filter", WithMode(ModeFilter)), d.mustRegister(t, "do")
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	ctx := context.Background()
	res, err := filter.Mark(ended, "k")
	want(t, res, err, Cancelled)
	if res, err = filter.Mark(ctx, "k"); res.Outcome != First {
		t.Fatalf("the Mark after a cancelled one answered %v (%v), want first: the cancelled one recorded the key", res.Outcome, err)
	}
	res, err = do.Do(ended, "k", func(context.Context) error { t.Error("fn ran on a cancelled context"); return nil })
	want(t, res, err, Cancelled)
	if strings.Contains(err.Error(), "\n") || !errors.Is(err, context.Canceled) {
		t.Errorf("error %q: want one line wrapping context.Canceled", err)
	}
	runs := 0
	res, err = do.Do(ctx, "k", func(context.Context) error { runs++; return nil })
	if want(t, res, err, Processed); runs != 1 {
		t.Fatalf("fn ran %d times after a cancelled Do, want 1", runs)
	}
}

// answerThenCancel is an in-process store whose Mark ends its caller's context after
// the memory store has answered: an answer the caller can no longer use as such.
type answerThenCancel struct {
	*memstore.Store
	cancel context.CancelFunc
}

func init() { storekit.RegisterInProcess(answerThenCancel{}) }

func (s answerThenCancel) Mark(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	as, err := s.Store.Mark(ctx, entries)
	s.cancel()
	return as, err
}

// TestAMarkAnsweredAsTheContextEndsStands: the store wrote DONE and answered, and the
// caller's context ended meanwhile. The answer is First, so that the caller runs its
// effect (or acks). Cancelled would leave the message for a redelivery that then
// finds DONE: lost.
func TestAMarkAnsweredAsTheContextEndsStands(t *testing.T) {
	mem, _ := memstore.New()
	ctx, cancel := context.WithCancel(context.Background())
	h := newDeduperOver(t, answerThenCancel{Store: mem, cancel: cancel}).mustRegister(t, "filter", WithMode(ModeFilter))
	res, err := h.Mark(ctx, "k")
	want(t, res, err, First)
	if err != nil || ctx.Err() == nil {
		t.Fatalf("err %v, ctx %v: the store should have ended ctx", err, ctx.Err())
	}
}

// TestFnReturningItsContextsErrorSaysItOnce: fn returns ctx.Err() at its deadline;
// the error says so once, on one line, not joined with the same cause again.
func TestFnReturningItsContextsErrorSaysItOnce(t *testing.T) {
	f := newFixture(t, true)
	h := f.handler("orders")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	res, err := h.Do(ctx, "k", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	want(t, res, err, Cancelled)
	if err.Error() != context.DeadlineExceeded.Error() || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %q, want %q", err, context.DeadlineExceeded)
	}
}

func TestCloseCancelsRunningAndRefusesNew(t *testing.T) {
	f := newFixture(t, false)
	h := f.handler("orders")
	started := make(chan struct{})
	var cause error
	done := make(chan Result)
	go func() {
		res, _ := h.Do(context.Background(), "k", func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			cause = context.Cause(ctx)
			return ctx.Err()
		})
		done <- res
	}()
	<-started
	if err := f.d.Close(); err != nil {
		t.Fatal(err)
	}
	if res := <-done; res.Outcome != Cancelled || !errors.Is(cause, ErrClosed) {
		t.Fatalf("outcome %v cause %v", res.Outcome, cause)
	}
	if f.store.releases.Load() != 1 {
		t.Fatal("claim not released on Close")
	}
	res, err := h.Do(context.Background(), "k2", ok)
	want(t, res, err, Cancelled)
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
	if _, err := f.d.Register("late"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Register after Close: %v", err)
	}
	if err := f.d.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
}

func TestConcurrentChecksShareStoreCalls(t *testing.T) {
	for _, mode := range []string{"do", "mark"} {
		t.Run(mode, func(t *testing.T) {
			f := newFixture(t, false)
			h := f.handler("orders")
			const n = 64
			var runs, firsts atomic.Int64
			release := make(chan struct{})
			var ready, wg sync.WaitGroup
			ready.Add(n)
			outcomes := make([]Outcome, n)
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					ready.Done()
					<-release
					var res Result
					if mode == "do" {
						res, _ = h.Do(context.Background(), "same", func(context.Context) error {
							runs.Add(1)
							time.Sleep(20 * time.Millisecond)
							return nil
						})
					} else {
						res, _ = h.Mark(context.Background(), "same")
						if res.Outcome == First {
							firsts.Add(1)
						}
					}
					outcomes[i] = res.Outcome
				}(i)
			}
			ready.Wait()
			close(release)
			wg.Wait()
			// Do's copies wait for the one claim (the in-flight table); Mark's go to the
			// store, which decides (the batcher merges them as they come: how many calls
			// depends on timing, TestBatcherMergesTheClaimsOfEveryCaller shows the merge)
			if checks := f.store.claims.Load() + f.store.marks.Load(); mode == "do" && checks != 1 {
				t.Fatalf("%d store checks for %d concurrent calls, want 1", checks, n)
			}
			if mode == "do" && runs.Load() != 1 {
				t.Fatalf("fn ran %d times", runs.Load())
			}
			if mode == "mark" && firsts.Load() != 1 {
				t.Fatalf("%d firsts", firsts.Load())
			}
			for _, o := range outcomes {
				switch o {
				case Processed, First, Duplicate, InProgress:
				default:
					t.Fatalf("outcome %v", o)
				}
			}
		})
	}
}

// A local hit allocates nothing and calls no store, through Do, Mark and DoTx
// (which answers it before building its transactional step), and each is counted.
func TestLocalHitDoesNotAllocate(t *testing.T) {
	f := newFixture(t, false)
	h := f.handler("orders")
	ctx := context.Background()
	if res, err := h.Do(ctx, "order-42", ok); res.Outcome != Processed {
		t.Fatal(res, err)
	}
	db := newFakeDB()
	okTx := func(context.Context, *fakeTx) error { return nil }
	claims := f.store.claims.Load()
	for name, call := range map[string]func() (Result, error){
		"Do":   func() (Result, error) { return h.Do(ctx, "order-42", ok) },
		"Mark": func() (Result, error) { return h.Mark(ctx, "order-42") },
		"DoTx": func() (Result, error) { return DoTx(ctx, h, "order-42", db, okTx) },
	} {
		before := h.Stats().LocalDuplicates
		allocs := testing.AllocsPerRun(1000, func() {
			if res, _ := call(); res.Tier != TierLocal || res.Outcome != Duplicate {
				t.Fatal("not a local hit")
			}
		})
		if allocs != 0 {
			t.Fatalf("%s: %v allocs per local hit", name, allocs)
		}
		if got := h.Stats().LocalDuplicates - before; got != 1001 { // AllocsPerRun runs once more
			t.Fatalf("%s: %d local hits counted, want 1001", name, got)
		}
	}
	if begins, _, _, _ := db.counts(); f.store.claims.Load() != claims || begins != 0 {
		t.Fatal("a local hit called the store or the database")
	}
}

func TestLocalTierHoldsOnlyDone(t *testing.T) {
	f := newFixture(t, false)
	h := f.handler("orders")
	ctx := context.Background()
	// InProgress from the store must not be cached as done
	if _, err := claim1(ctx, f.mem, h.RecordKey("k"), "other", "", time.Minute); err != nil {
		t.Fatal(err)
	}
	res, _ := h.Do(ctx, "k", ok)
	want(t, res, nil, InProgress)
	if err := release1(ctx, f.mem, h.RecordKey("k"), "other"); err != nil {
		t.Fatal(err)
	}
	res, _ = h.Do(ctx, "k", ok)
	want(t, res, nil, Processed)
}

func TestLocalCacheExpires(t *testing.T) {
	f := newFixture(t, false)
	h := f.handler("orders", WithLocalCache(10, time.Millisecond*50))
	ctx := context.Background()
	h.Do(ctx, "k", ok)
	time.Sleep(60 * time.Millisecond) // the local tier runs on the real clock
	before := f.store.claims.Load()
	res, _ := h.Do(ctx, "k", ok)
	want(t, res, nil, Duplicate)
	if res.Tier != TierStore || f.store.claims.Load() != before+1 {
		t.Fatalf("tier %v: an expired local entry answered", res.Tier)
	}
}

func TestInvalidOptionsAreErrInvalidOptionNamingTheSetting(t *testing.T) {
	f := newFixture(t, false)
	cases := []struct {
		name, mention string
		opts          []HandlerOption
	}{
		{"", "handler name", nil},
		{"a:b", "handler name", nil},
		{strings.Repeat("x", 65), "handler name", nil},
		{"ok", "retention", []HandlerOption{WithRetention(0)}},
		{"ok", "lease", []HandlerOption{WithLease(time.Millisecond)}},
		{"ok", "local cache size", []HandlerOption{WithLocalCache(-1, 0)}},
		{"ok", "local cache ttl", []HandlerOption{WithRetention(time.Minute), WithLocalCache(10, time.Hour)}},
		{"ok", "key strategy", []HandlerOption{WithKeyStrategy(nil)}},
		{"ok", "key strategy", []HandlerOption{WithKeyStrategy(keys.Header(""))}},
		{"ok", "missing-key policy", []HandlerOption{WithMissingKey(9)}},
		{"ok", "store-failure policy", []HandlerOption{WithStoreFailure(9)}},
		{"ok", "mode", []HandlerOption{WithMode(9)}},
	}
	for _, c := range cases {
		_, err := f.d.Register(c.name, c.opts...)
		if !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), c.mention) {
			t.Errorf("Register(%q): err %v, want ErrInvalidOption naming %q", c.name, err, c.mention)
		}
	}
	f.handler("dup")
	if _, err := f.d.Register("dup"); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("duplicate name: %v", err)
	}
	if _, err := New(nil); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("nil store: %v", err)
	}
	for _, o := range []Option{WithPrefix(""), WithPrefix("a b"), WithLogger(nil)} {
		if _, err := New(f.mem, o); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("bad engine option: %v", err)
		}
	}
	if _, err := redisstore.New(nil); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("nil client: %v", err)
	}
	for _, o := range []memstore.Option{memstore.WithLimit(0), memstore.WithClock(nil)} {
		if _, err := memstore.New(o); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("bad memory option: %v", err)
		}
	}
}

// Each call counts one outcome, so the counters add up to the calls.
func TestStatsCountOneOutcomePerCall(t *testing.T) {
	f := newFixture(t, false)
	h := f.handler("views", WithMode(ModeFilter))
	ctx := context.Background()
	msg := keys.Raw{Headers: map[string]string{"Nats-Msg-Id": "m1"}}
	for i := 0; i < 3; i++ {
		h.Handle(ctx, msg, ok)
	}
	h.Mark(ctx, "m2")
	st := h.Stats()
	if st.Count(Processed) != 1 || st.Count(Duplicate) != 2 || st.Count(First) != 1 {
		t.Fatalf("processed %d duplicate %d first %d, want 1, 2, 1", st.Count(Processed), st.Count(Duplicate), st.Count(First))
	}
}

// The record key the engine writes is keys.RecordKey's, for plain and hashed keys.
func TestRecordKeyMatchesKeysPackage(t *testing.T) {
	f := newFixture(t, false)
	h := f.handler("orders", WithLocalCache(0, 0))
	ctx := context.Background()
	for _, k := range []string{"plain-1", strings.Repeat("long", 40), "sp ace", "\x00bin"} {
		if res, err := h.Do(ctx, k, ok); res.Outcome != Processed {
			t.Fatal(res, err)
		}
		if a, _ := claim1(ctx, f.mem, keys.RecordKey(DefaultPrefix, "orders", k), "x", "", time.Minute); a.Status != driver.StatusDuplicate {
			t.Fatalf("%q: record not under keys.RecordKey (%v)", k, a.Status)
		}
	}
}
