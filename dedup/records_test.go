package dedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/testenv"
	"github.com/dedupkit/dedupkit/keys"
)

// realRedisAddr is the address of the real server realRedis uses: DEDUP_REDIS_ADDR,
// else the shared spawned redis-server. At cleanup the keys under prefix are deleted.
func realRedisAddr(t testing.TB, prefix string) string {
	t.Helper()
	testenv.Redis(t, prefix) // skips without a server; deletes prefix's keys at cleanup
	if addr := os.Getenv("DEDUP_REDIS_ADDR"); addr != "" {
		return addr
	}
	return testenv.SharedRedisAddr(t)
}

// redisStoreAt returns a redisstore.Store on a client of its own (its own connections) to
// addr, closed at cleanup.
func redisStoreAt(t testing.TB, addr string) *redisstore.Store {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// recordBackends are the stores the handler-level record tests run on.
func recordBackends() []backendFactory {
	var out []backendFactory
	for _, bf := range storeBackends() {
		switch bf.name {
		case "memory", "redis-server", "redis-cluster":
			out = append(out, bf)
		}
	}
	return out
}

func newDeduper(t testing.TB, s driver.Store, opts ...Option) *Deduper {
	t.Helper()
	d, err := New(s, append([]Option{WithLogger(quiet)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// register registers a handler and waits until its local tier takes keys (its
// forget notices' subscription is confirmed), as the tests of the local tier expect.
func register(t testing.TB, d *Deduper, name string, opts ...HandlerOption) *Handler {
	t.Helper()
	h, err := d.Register(name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	listening(t, h)
	return h
}

// listening waits until h's local tier takes keys (see Handler.listening).
func listening(t testing.TB, h *Handler) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "the local tier of "+h.name+" takes keys", h.listening.Load)
}

// Lookup reports state, owner, remaining life, fingerprint and reply size, for a key
// given as the application passes it (here one that is stored hashed), without the
// caller hashing anything; LookupMany answers in key order.
func TestLookup(t *testing.T) {
	for _, bf := range recordBackends() {
		t.Run(bf.name, func(t *testing.T) {
			t.Parallel()
			b := bf.new(t)
			ctx := context.Background()
			d := newDeduper(t, b.store, WithPrefix(b.prefix))
			h := register(t, d, "orders", WithFingerprint(true), WithRetention(time.Hour), WithLease(time.Minute))
			key := "order 1: " + strings.Repeat("é", 50) // not plain: stored as its SHA-256
			payload := []byte("payload")
			started, finish := make(chan struct{}), make(chan struct{})
			done := make(chan Result)
			go func() {
				res, _ := handleKey(h, ctx, key, payload, func(context.Context) error {
					close(started)
					<-finish
					return nil
				})
				done <- res
			}()
			<-started
			info, err := h.Lookup(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if info.State != driver.RecordInProgress || info.Owner == "" || info.TTL <= 0 || info.TTL > time.Minute ||
				info.Fingerprint != Fingerprint(payload) || info.Handler != "orders" || info.RecordKey != h.RecordKey(key) ||
				info.ReplySize != 0 || info.Notified != 0 {
				t.Fatalf("while fn runs: %+v", info)
			}
			owner := info.Owner
			close(finish)
			if res := <-done; res.Outcome != Processed {
				t.Fatalf("run: %v", res.Outcome)
			}
			infos, err := h.LookupMany(ctx, []string{"absent-1", key})
			if err != nil {
				t.Fatal(err)
			}
			if a := infos[0]; a.State != driver.RecordAbsent || a.Owner != "" || a.TTL != 0 || a.RecordKey != h.RecordKey("absent-1") || a.Err != nil {
				t.Fatalf("absent: %+v", a)
			}
			if i := infos[1]; i.State != driver.RecordDone || i.Owner != owner || i.TTL <= time.Minute || i.TTL > time.Hour ||
				i.Fingerprint != Fingerprint(payload) {
				t.Fatalf("done: %+v", i)
			}
			if _, err := h.Lookup(ctx, ""); !errors.Is(err, ErrInvalidOption) {
				t.Fatalf("empty key: %v", err)
			}
			d.Close()
			if _, err := h.Lookup(ctx, key); !errors.Is(err, ErrClosed) {
				t.Fatalf("after Close: %v", err)
			}
		})
	}
}

// Lookup and Forget give a stored reply's size, never its bytes (they may be a
// payment's details), on every store.
func TestLookupAndForgetNeverShowAReplysBytes(t *testing.T) {
	for _, bf := range recordBackends() {
		t.Run(bf.name, func(t *testing.T) {
			t.Parallel()
			b := bf.new(t)
			ctx := context.Background()
			h := register(t, newDeduper(t, b.store, WithPrefix(b.prefix)), "orders", WithReplies(0))
			secret := "card=4111-1111-1111-1111"
			if r, err := runReply(h, ctx, "order-1", nil, func(context.Context) ([]byte, error) { return []byte(secret), nil }); r.Outcome != Processed {
				t.Fatalf("run: %+v, %v", r, err)
			}
			info, err := h.Lookup(ctx, "order-1")
			if err != nil || info.State != driver.RecordDone || !info.HasReply || info.ReplySize != len(secret) || info.Reply != "" {
				t.Fatalf("lookup: %+v, %v", info, err)
			}
			if info, err = h.Forget(ctx, "order-1"); err != nil || info.State != driver.RecordDone || info.ReplySize != len(secret) || info.Reply != "" {
				t.Fatalf("forget: %+v, %v", info, err)
			}
		})
	}
}

// A store that does not implement RecordStore (here one behind a wrapper that embeds
// Store) says so: Lookup, Forget and CountRecords wrap errors.ErrUnsupported, and
// Register refuses former names.
func TestStoreWithoutRecordStoreIsErrUnsupported(t *testing.T) {
	mem, _ := memstore.New()
	d := newDeduper(t, &hookStore{Store: mem})
	h := register(t, d, "orders")
	ctx := context.Background()
	if _, err := h.Lookup(ctx, "k"); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Lookup: %v", err)
	}
	if _, err := h.Forget(ctx, "k"); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Forget: %v", err)
	}
	if _, err := d.CountRecords(ctx, ""); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("CountRecords: %v", err)
	}
	if _, err := h.Subscribers(ctx); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Subscribers: %v", err)
	}
	if _, err := d.Register("payments", WithFormerNames("charges")); !errors.Is(err, ErrInvalidOption) || !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("WithFormerNames: %v", err)
	}
}

// Forget makes a DONE key run again (its local tier too), and refuses a record IN
// PROGRESS unless forced. Forced, the owner's heartbeat would find its lease lost;
// a run that succeeds first writes DONE all the same (docs/design.md §3).
func TestForgetMakesADoneKeyRunAgainAndRefusesInProgressUnlessForced(t *testing.T) {
	for _, bf := range recordBackends() {
		t.Run(bf.name, func(t *testing.T) {
			t.Parallel()
			b := bf.new(t)
			ctx := context.Background()
			d := newDeduper(t, b.store, WithPrefix(b.prefix))
			h := register(t, d, "orders", WithLease(time.Minute))
			res, err := h.Do(ctx, "order-1", ok)
			want(t, res, err, Processed)
			res, err = h.Do(ctx, "order-1", ok)
			want(t, res, err, Duplicate)
			if res.Tier != TierLocal {
				t.Fatalf("tier %v, want local", res.Tier)
			}
			info, err := h.Forget(ctx, "order-1")
			if err != nil || info.State != driver.RecordDone || info.Handler != "orders" {
				t.Fatalf("Forget: %+v %v", info, err)
			}
			if info, err := h.Lookup(ctx, "order-1"); err != nil || info.State != driver.RecordAbsent {
				t.Fatalf("Lookup after Forget: %+v %v", info, err)
			}
			res, err = h.Do(ctx, "order-1", ok)
			want(t, res, err, Processed)

			// a record never written, or deleted by hand: not an error
			if info, err := h.Forget(ctx, "order-2"); err != nil || info.State != driver.RecordAbsent {
				t.Fatalf("Forget of an absent record: %+v %v", info, err)
			}

			started, finish := make(chan struct{}), make(chan struct{})
			done := make(chan error, 1)
			go func() {
				res, err := h.Do(ctx, "order-3", func(ctx context.Context) error {
					close(started)
					<-finish
					return nil
				})
				if res.Outcome != Processed || err != nil {
					err = fmt.Errorf("outcome %v (%v), want Processed", res.Outcome, err)
				} else {
					err = nil
				}
				done <- err
			}()
			<-started
			info, err = h.Forget(ctx, "order-3")
			if !errors.Is(err, ErrRecordInProgress) || info.State != driver.RecordInProgress || info.TTL <= 0 {
				t.Fatalf("Forget of a record in progress: %+v %v", info, err)
			}
			if info, err := h.Lookup(ctx, "order-3"); err != nil || info.State != driver.RecordInProgress {
				t.Fatalf("left alone: %+v %v", info, err)
			}
			if info, err := h.Forget(ctx, "order-3", ForgetInProgress()); err != nil || info.State != driver.RecordInProgress {
				t.Fatalf("forced: %+v %v", info, err)
			}
			if info, err := h.Lookup(ctx, "order-3"); err != nil || info.State != driver.RecordAbsent {
				t.Fatalf("forced, before the run ends: %+v %v", info, err)
			}
			close(finish)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if info, err := h.Lookup(ctx, "order-3"); err != nil || info.State != driver.RecordDone {
				t.Fatalf("after the run succeeded: %+v %v", info, err)
			}
			if _, err := h.Forget(ctx, ""); !errors.Is(err, ErrInvalidOption) {
				t.Fatalf("empty key: %v", err)
			}
		})
	}
}

// Three Dedupers on separate connections to one Redis (three processes, as far as the
// store can tell) run one handler with a local tier. A key forgotten through one of
// them leaves every local tier, within a measured time well inside the bound, and
// runs again in each; the other keys all stay in every local tier. A key gone from a
// local tier does not say that its notice was heard there: the forgetting process
// drops it itself before its notice (its own echo) comes back, and a process whose
// key a late notice had already dropped holds nothing to drop. A notice heard after
// the key runs again drops it once more, so each round waits for a fence (below)
// before it runs the key again.
func TestForgetReachesEveryProcess(t *testing.T) {
	t.Parallel()
	prefix := testenv.Prefix()
	addr := realRedisAddr(t, prefix)
	ctx := context.Background()
	const others = 50
	var hs []*Handler
	for range 3 {
		d := newDeduper(t, redisStoreAt(t, addr), WithPrefix(prefix))
		hs = append(hs, register(t, d, "orders"))
	}
	keys := []string{"order-x"}
	for i := range others {
		keys = append(keys, fmt.Sprintf("order-%d", i))
	}
	for i, h := range hs { // the first runs each key, the others learn it from Redis
		for _, k := range keys {
			res, err := h.Do(ctx, k, ok)
			want(t, res, err, map[bool]Outcome{true: Processed, false: Duplicate}[i == 0])
		}
	}
	// Notices reach each subscription in the order Redis published them: once a fence
	// key put into every local tier has left them all, forgotten by a fourth Deduper
	// (with no local tier: no subscriber), each process has heard the notices
	// published before, its own echo included.
	fencer := register(t, newDeduper(t, redisStoreAt(t, addr), WithPrefix(prefix)), "orders", WithLocalCache(0, 0))
	heard := func(round int) {
		t.Helper()
		fence := fmt.Sprintf("fence-%d", round)
		for _, h := range hs {
			h.local.Add(fence)
		}
		if info, err := fencer.Forget(ctx, fence); err != nil || info.Notified != len(hs) {
			t.Fatalf("round %d: fence: %+v %v (want a notice to %d subscribers)", round, info, err, len(hs))
		}
		for i, h := range hs {
			testenv.Eventually(t, 10*time.Second, fmt.Sprintf("round %d: process %d hears the fence", round, i),
				func() bool { return !h.local.Contains(fence) })
		}
	}
	lens := make([]int, len(hs))
	for i, h := range hs {
		for _, k := range keys {
			if !h.local.Contains(k) {
				t.Fatalf("process %d: %s not in its local tier", i, k)
			}
		}
		lens[i] = h.local.Len()
	}
	for round, forgetter := range []int{0, 1, 2} {
		info, err := hs[forgetter].Forget(ctx, "order-x")
		forgotAt := time.Now()
		if err != nil || info.State != driver.RecordDone || info.Notified != len(hs) {
			t.Fatalf("round %d: Forget: %+v %v (want DONE, storekit.Notice to %d subscribers)", round, info, err, len(hs))
		}
		for i, h := range hs {
			for h.local.Contains("order-x") {
				if time.Since(forgotAt) > defaultForgetBound {
					t.Fatalf("round %d: process %d still holds the key %v after Forget", round, i, defaultForgetBound)
				}
				time.Sleep(100 * time.Microsecond)
			}
			t.Logf("round %d: process %d dropped the key %v after Forget returned", round, i, time.Since(forgotAt))
		}
		heard(round)
		// it runs again in process `round`; the others find it DONE in Redis, not locally
		runner := hs[round]
		res, err := runner.Do(ctx, "order-x", ok)
		want(t, res, err, Processed)
		for i, h := range hs {
			if i == round {
				continue
			}
			res, err := h.Do(ctx, "order-x", ok)
			want(t, res, err, Duplicate)
			if res.Tier != TierStore {
				t.Fatalf("round %d: process %d answered from tier %v, want store (its local tier was not told)", round, i, res.Tier)
			}
		}
	}
	for i, h := range hs { // nothing else was evicted
		for _, k := range keys[1:] {
			if !h.local.Contains(k) {
				t.Fatalf("process %d: %s left the local tier", i, k)
			}
		}
		if h.local.Len() != lens[i] {
			t.Fatalf("process %d: local tier holds %d keys, had %d", i, h.local.Len(), lens[i])
		}
	}
}

// heldStore is a memstore.Store whose answers to one operation on one record key can
// be held after the store has made them and before they reach the caller.
type heldStore struct {
	*memstore.Store
	op, key string        // what is held
	hold    chan struct{} // answers wait for it to close
	held    chan struct{} // closed once an answer waits
	once    sync.Once
}

func (s *heldStore) wait(op string, entries []driver.Entry) {
	for _, e := range entries {
		if op == s.op && e.Key == s.key {
			s.once.Do(func() { close(s.held) })
			<-s.hold
		}
	}
}

func (s *heldStore) Claim(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	a, err := s.Store.Claim(ctx, entries)
	s.wait("claim", entries)
	return a, err
}

func (s *heldStore) Mark(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	a, err := s.Store.Mark(ctx, entries)
	s.wait("mark", entries)
	return a, err
}

func (s *heldStore) Complete(ctx context.Context, entries []driver.Entry) ([]error, error) {
	errs, err := s.Store.Complete(ctx, entries)
	s.wait("complete", entries)
	return errs, err
}

// An answer that says DONE, made before a Forget and returned after its notice was
// applied, is not left in the local tier: the notice drops the key while the answer
// is on its way, then the answer arrives. Without the mark the notice leaves on the
// flight (remember's check), the stale answer would be cached, and the key would
// answer Duplicate locally until its TTL. Three answers are cached: a claim's
// Duplicate, a mark's first sighting, a completion.
func TestAnswerOvertakenByAForgetIsNotCached(t *testing.T) {
	for _, tc := range []struct {
		op   string
		mode Mode
		pre  bool    // the key is DONE before: the held claim answers Duplicate
		want Outcome // of the held call
	}{
		{"claim", ModeDo, true, Duplicate},
		{"mark", ModeFilter, false, Processed},
		{"complete", ModeDo, false, Processed},
	} {
		t.Run(tc.op, func(t *testing.T) {
			t.Parallel()
			mem, _ := memstore.New()
			ctx := context.Background()
			held := &heldStore{Store: mem, hold: make(chan struct{}), held: make(chan struct{})}
			a := register(t, newDeduper(t, held), "orders", WithMode(tc.mode))
			b := register(t, newDeduper(t, mem), "orders", WithMode(tc.mode))
			var release sync.Once
			t.Cleanup(func() { release.Do(func() { close(held.hold) }) }) // before the Dedupers close
			if tc.pre {
				res, err := handleKey(b, ctx, "order-1", nil, ok)
				want(t, res, err, Processed)
			}
			held.op, held.key = tc.op, a.RecordKey("order-1")
			done := make(chan Result, 1)
			go func() {
				res, _ := handleKey(a, ctx, "order-1", nil, ok)
				done <- res
			}()
			<-held.held // the store has answered; the answer is on its way
			if _, err := b.Forget(ctx, "order-1"); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, 5*time.Second, "the storekit.Notice counted by a", func() bool { return a.forgets.Load() > 0 })
			release.Do(func() { close(held.hold) })
			if res := <-done; res.Outcome != tc.want {
				t.Fatalf("the held call: %v, want %v", res.Outcome, tc.want)
			}
			if a.local.Contains("order-1") {
				t.Fatal("the answer made before the Forget was cached after it")
			}
			held.op = ""
			res, err := handleKey(a, ctx, "order-1", nil, ok)
			want(t, res, err, Processed)
		})
	}
}

// A notice that never arrives (the subscription's connection is stalled: a proxy
// holds everything the server sends on it) does not leave a forgotten key in a local
// tier past the bound: the Deduper hears nothing from its subscription, drops its
// local tiers, and says so in its health report.
func TestMissedForgetNoticesDropTheLocalTiersWithinTheBound(t *testing.T) {
	t.Parallel()
	prefix := testenv.Prefix()
	addr := realRedisAddr(t, prefix)
	proxy, err := testenv.NewProxy(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	const bound = 800 * time.Millisecond
	ctx := context.Background()
	da := newDeduper(t, redisStoreAt(t, proxy.Addr()), WithPrefix(prefix), WithForgetBound(bound))
	a := register(t, da, "orders")
	b := register(t, newDeduper(t, redisStoreAt(t, addr), WithPrefix(prefix)), "orders")
	res, err := a.Do(ctx, "order-1", ok)
	want(t, res, err, Processed)
	if !a.local.Contains("order-1") {
		t.Fatal("not cached")
	}
	// the next reply through the proxy, the answer to a's listener's PING after a
	// quarter of the bound of silence, is held for long, and all after it
	stalled := make(chan struct{})
	proxy.Arm(testenv.Fault{Kind: testenv.Delay, Replies: 1, Hold: 10 * bound, OnHit: func(int) { close(stalled) }})
	<-stalled
	if _, err := b.Forget(ctx, "order-1"); err != nil {
		t.Fatal(err)
	}
	forgotAt := time.Now()
	for a.local.Contains("order-1") {
		if time.Since(forgotAt) > bound {
			t.Fatalf("the key is still in the local tier %v after a Forget whose storekit.Notice was lost", bound)
		}
		time.Sleep(time.Millisecond)
	}
	took := time.Since(forgotAt)
	t.Logf("dropped %v after the Forget (bound %v); the storekit.Notice itself is held for %v", took, bound, 10*bound)
	// The line was heard from (a PONG) a tick or less before it stalled, so the
	// fallback comes a tick or more after: an earlier drop is another cause's.
	if took < bound/8 {
		t.Fatalf("dropped %v after the Forget: too soon for the silence fallback", took)
	}
	c := find(t, da.Health(ctx), driver.CheckForgetNotices, "")
	if c.Status != driver.HealthWarn || !strings.Contains(c.Detail, "nothing heard") {
		t.Fatalf("health while the subscription is silent: %+v", c)
	}
	res, err = a.Do(ctx, "order-1", ok)
	want(t, res, err, Processed)
}

// A quiet subscription (no notice for many ticks) stays heard from, by its PINGs: the
// local tier is not dropped for want of notices, and the health report is ok.
func TestQuietNoticeSubscriptionKeepsTheLocalTier(t *testing.T) {
	t.Parallel()
	prefix := testenv.Prefix()
	addr := realRedisAddr(t, prefix)
	const bound = 800 * time.Millisecond
	ctx := context.Background()
	d := newDeduper(t, redisStoreAt(t, addr), WithPrefix(prefix), WithForgetBound(bound))
	h := register(t, d, "orders")
	res, err := h.Do(ctx, "order-1", ok)
	want(t, res, err, Processed)
	for end := time.Now().Add(4 * bound); time.Now().Before(end); time.Sleep(bound / 8) {
		if !h.local.Contains("order-1") {
			t.Fatal("the local tier was dropped though no storekit.Notice was lost")
		}
	}
	wantCheck(t, find(t, d.Health(ctx), driver.CheckForgetNotices, ""), driver.HealthOK)
}

// A fingerprinted key is held locally as key#fingerprint, for each payload seen:
// Forget drops every one of them, in every Deduper, and the other keys stay.
func TestForgetDropsEveryFingerprintOfAKey(t *testing.T) {
	mem, _ := memstore.New()
	ctx := context.Background()
	a := register(t, newDeduper(t, mem), "orders", WithFingerprint(true))
	b := register(t, newDeduper(t, mem), "orders", WithFingerprint(true))
	p := []byte("payload-p")
	res, err := handleKey(a, ctx, "order-1", p, ok)
	want(t, res, err, Processed)
	res, err = handleKey(a, ctx, "order-2", p, ok)
	want(t, res, err, Processed)
	res, err = handleKey(b, ctx, "order-1", p, ok)
	want(t, res, err, Duplicate)
	res, err = b.Do(ctx, "order-1", ok) // no payload: held without a fingerprint
	want(t, res, err, Duplicate)
	lk := localKey("order-1", Fingerprint(p))
	if !a.local.Contains(lk) || !b.local.Contains(lk) || !b.local.Contains("order-1") {
		t.Fatal("not cached")
	}
	if _, err := a.Forget(ctx, "order-1"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "b drops the key", func() bool {
		return !b.local.Contains(lk) && !b.local.Contains("order-1")
	})
	if a.local.Contains(lk) {
		t.Fatal("a holds the key it forgot")
	}
	for _, h := range []*Handler{a, b} {
		if h == a && !h.local.Contains(localKey("order-2", Fingerprint(p))) {
			t.Fatal("another key was dropped")
		}
	}
	res, err = handleKey(b, ctx, "order-1", []byte("payload-q"), ok)
	want(t, res, err, Processed)
}

// CountRecords counts records by handler under the prefix, on every store (on a
// Cluster, across its masters), and leaves out keys that are not records.
func TestCountRecordsCountsByHandlerOnEveryStore(t *testing.T) {
	for _, bf := range storeBackends() {
		if strings.HasSuffix(bf.name, "-direct") {
			continue // the same client, scanned the same way
		}
		t.Run(bf.name, func(t *testing.T) {
			t.Parallel()
			b := bf.new(t)
			ctx := context.Background()
			d := newDeduper(t, b.store, WithPrefix(b.prefix))
			orders := register(t, d, "orders", WithLocalCache(0, 0))
			audit := register(t, d, "audit", WithLocalCache(0, 0), WithMode(ModeFilter))
			for i := range 30 {
				res, err := orders.Do(ctx, fmt.Sprintf("order-%d", i), ok)
				want(t, res, err, Processed)
			}
			for i := range 7 {
				res, err := audit.Mark(ctx, fmt.Sprintf("audit %d: %s", i, strings.Repeat("é", 40)))
				want(t, res, err, First)
			}
			if b.rdb != nil { // not records: a bad handler name, a bare prefix key
				for _, k := range []string{b.prefix + ":bad name:x", b.prefix + ":orders"} {
					if err := b.rdb.Set(ctx, k, "x", time.Minute).Err(); err != nil {
						t.Fatal(err)
					}
				}
			}
			other := register(t, newDeduper(t, b.store, WithPrefix(b.prefix+"x")), "orders", WithLocalCache(0, 0))
			res, err := other.Do(ctx, "order-1", ok)
			want(t, res, err, Processed)
			t.Cleanup(func() {
				if b.rdb != nil {
					testenv.DeletePrefix(t, b.rdb, b.prefix+"x")
				}
			})
			got, err := d.CountRecords(ctx, "")
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(map[string]int64{"audit": 7, "orders": 30}) {
				t.Fatalf("counts %v", got)
			}
			got, err = d.CountRecords(ctx, "audit")
			if err != nil || fmt.Sprint(got) != fmt.Sprint(map[string]int64{"audit": 7}) {
				t.Fatalf("audit: %v %v", got, err)
			}
			got, err = d.CountRecords(ctx, "nobody")
			if err != nil || len(got) != 0 {
				t.Fatalf("unknown handler: %v %v", got, err)
			}
			if _, err := d.CountRecords(ctx, "bad name"); !errors.Is(err, ErrInvalidOption) {
				t.Fatalf("bad name: %v", err)
			}
		})
	}
}

// Subscribers counts the Dedupers that run a handler with a local tier on the store.
func TestSubscribersCountsTheDedupersWithALocalTier(t *testing.T) {
	for _, bf := range recordBackends() {
		t.Run(bf.name, func(t *testing.T) {
			t.Parallel()
			b := bf.new(t)
			ctx := context.Background()
			d1 := newDeduper(t, b.store, WithPrefix(b.prefix))
			h1 := register(t, d1, "orders")
			d2 := newDeduper(t, b.store, WithPrefix(b.prefix))
			register(t, d2, "orders")
			register(t, newDeduper(t, b.store, WithPrefix(b.prefix)), "orders", WithLocalCache(0, 0)) // no tier: not subscribed
			renamed := register(t, newDeduper(t, b.store, WithPrefix(b.prefix)), "orders-v2", WithFormerNames("orders"))
			if n, err := h1.Subscribers(ctx); err != nil || n != 3 {
				t.Fatalf("subscribers %d %v, want 3 (two, and one with it as a former name)", n, err)
			}
			if n, err := renamed.Subscribers(ctx); err != nil || n != 1 {
				t.Fatalf("subscribers of orders-v2 %d %v, want 1", n, err)
			}
			d2.Close()
			testenv.Eventually(t, 5*time.Second, "one subscriber fewer", func() bool {
				n, err := h1.Subscribers(ctx)
				return err == nil && n == 2
			})
		})
	}
}

// The log lines of Forget and of the notices name the key by its hash only.
func TestLogsOfForgetHoldNoKey(t *testing.T) {
	for _, key := range []string{secretPlainKey, secretHashedKey} {
		mem, _ := memstore.New()
		logs := &testenv.LogBuffer{}
		logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		ctx := context.Background()
		a := register(t, newDeduper(t, mem, WithLogger(logger)), "orders", WithFingerprint(true))
		b := register(t, newDeduper(t, mem, WithLogger(logger)), "orders-v2", WithFormerNames("orders"))
		res, err := handleKey(a, ctx, key, []byte(secretPayloadA), ok)
		want(t, res, err, Processed)
		res, err = handleKey(b, ctx, key, []byte(secretPayloadA), ok) // found under the former name
		want(t, res, err, Duplicate)
		if _, err := b.Forget(ctx, key); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 5*time.Second, "a drops the key", func() bool { return strings.Count(logs.String(), "dropped from the local tier") >= 2 })
		out := logs.String()
		for _, msg := range []string{"record forgotten", "dropped from the local tier", "found under a former name"} {
			if !strings.Contains(out, msg) {
				t.Fatalf("no %q line:\n%s", msg, out)
			}
		}
		for _, secret := range []string{key, keys.Normalize(key), a.RecordKey(key), secretPayloadA} {
			if strings.Contains(out, secret) {
				t.Fatalf("a log line holds %q:\n%s", secret, out)
			}
		}
	}
}
