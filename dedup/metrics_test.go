package dedup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/internal/batcher"
	"github.com/dedupkit/dedupkit/dedup/internal/meter"
	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// The instruments' attribute keys, as docs/operating.md names them.
const (
	attrHandler   = attribute.Key("dedup.handler.name")
	attrOutcome   = attribute.Key("dedup.outcome")
	attrTier      = attribute.Key("dedup.tier")
	attrOperation = attribute.Key("dedup.operation.name")
)

// outcomeAttr is o as a dedup.outcome value: snake_case.
func outcomeAttr(o Outcome) string { return strings.ReplaceAll(o.String(), "-", "_") }

// metered is a Deduper over a hook store, with metrics read by a manual reader.
type metered struct {
	t      *testing.T
	reader *sdkmetric.ManualReader
	store  *hookStore
	d      *Deduper
}

func newMetered(t *testing.T) *metered {
	t.Helper()
	mem, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	m := &metered{t: t, reader: reader, store: &hookStore{Store: mem}}
	m.d, err = New(m.store, WithLogger(quiet), WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.d.Close() })
	return m
}

func (m *metered) handler(name string, opts ...HandlerOption) *Handler {
	m.t.Helper()
	h, err := m.d.Register(name, opts...)
	if err != nil {
		m.t.Fatal(err)
	}
	return h
}

// collect reads every instrument of the dedup scope.
func (m *metered) collect() map[string]metricdata.Metrics {
	m.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := m.reader.Collect(context.Background(), &rm); err != nil {
		m.t.Fatal(err)
	}
	out := make(map[string]metricdata.Metrics)
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != meter.Name {
			m.t.Fatalf("instrument scope %q, want %q", sm.Scope.Name, meter.Name)
		}
		for _, mt := range sm.Metrics {
			out[mt.Name] = mt
		}
	}
	return out
}

// has reports whether set holds every one of kvs.
func has(set attribute.Set, kvs []attribute.KeyValue) bool {
	for _, kv := range kvs {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// sum adds up the data points of a counter (or async up-down counter) that carry kvs.
func sum(t *testing.T, ms map[string]metricdata.Metrics, name string, kvs ...attribute.KeyValue) int64 {
	t.Helper()
	mt, ok := ms[name]
	if !ok {
		return 0
	}
	s, ok := mt.Data.(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("%s is a %T, want an int64 sum", name, mt.Data)
	}
	var n int64
	for _, p := range s.DataPoints {
		if has(p.Attributes, kvs) {
			n += p.Value
		}
	}
	return n
}

// observations counts a histogram's recordings that carry kvs.
func observations(t *testing.T, ms map[string]metricdata.Metrics, name string, kvs ...attribute.KeyValue) uint64 {
	t.Helper()
	mt, ok := ms[name]
	if !ok {
		return 0
	}
	h, ok := mt.Data.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("%s is a %T, want a float64 histogram", name, mt.Data)
	}
	var n uint64
	for _, p := range h.DataPoints {
		if has(p.Attributes, kvs) {
			n += p.Count
		}
	}
	return n
}

func handlerIs(name string) attribute.KeyValue { return attrHandler.String(name) }
func outcomeIs(o Outcome) attribute.KeyValue   { return attrOutcome.String(outcomeAttr(o)) }
func opIs(op string) attribute.KeyValue        { return attrOperation.String(op) }

// Every instrument, read through the SDK's manual reader, counts what the calls did.
func TestEveryInstrumentCountsWhatTheCallsDid(t *testing.T) {
	m := newMetered(t)
	ctx := context.Background()
	boom := errors.New("boom")
	fail := func(context.Context) error { return boom }
	failOn := func(ops map[string]error) {
		m.store.onFail(func(op string) error { return ops[op] })
	}
	unavailable := fmt.Errorf("%w: injected", ErrStoreUnavailable)

	orders := m.handler("orders")
	nolocal := m.handler("nolocal", WithLocalCache(0, 0))
	fp := m.handler("fp", WithFingerprint(true))
	open := m.handler("open", WithStoreFailure(FailOpen))
	filter := m.handler("filter", WithMode(ModeFilter))
	lease := m.handler("lease", WithLease(minLease))

	runs := map[string]int{}
	run := func(name string) func(context.Context) error {
		return func(context.Context) error { runs[name]++; return nil }
	}
	res, err := orders.Do(ctx, "k1", run("orders"))
	want(t, res, err, Processed)
	res, err = orders.Do(ctx, "k1", run("orders"))
	want(t, res, err, Duplicate)
	res, err = orders.Do(ctx, "k2", fail)
	want(t, res, err, Failed)
	res, err = orders.Do(ctx, "", run("orders"))
	want(t, res, err, NoKey)
	res, err = nolocal.Do(ctx, "k1", run("nolocal"))
	want(t, res, err, Processed)
	res, err = nolocal.Do(ctx, "k1", run("nolocal"))
	want(t, res, err, Duplicate)
	res, err = handleKey(fp, ctx, "k1", []byte("a"), run("fp"))
	want(t, res, err, Processed)
	res, err = handleKey(fp, ctx, "k1", []byte("b"), run("fp"))
	want(t, res, err, KeyReuse)
	res, err = filter.Mark(ctx, "m1")
	want(t, res, err, First)
	for i, r := range nolocal.Run(ctx, []Item{{Key: "b1"}, {Key: "b2"}}, func(context.Context, int) error { return nil }) {
		if r.Outcome != Processed {
			t.Fatalf("batch item %d: %v %v", i, r.Outcome, r.Err)
		}
	}

	failOn(map[string]error{"claim": unavailable})
	res, err = open.Do(ctx, "k1", run("open"))
	if res.Outcome != Processed || !res.Unguarded {
		t.Fatalf("fail open: %+v %v", res, err)
	}
	res, err = orders.Do(ctx, "k3", run("orders"))
	want(t, res, err, StoreUnavailable)

	failOn(map[string]error{"claim": unavailable})
	for _, r := range open.Run(ctx, []Item{{Key: "b1"}}, func(context.Context, int) error { runs["open"]++; return nil }, asBatch) {
		if r.Outcome != Processed || !r.Unguarded {
			t.Fatalf("fail open, batch: %+v %v", r.Result, r.Err)
		}
	}

	failOn(nil) // the claims' failures opened the breaker: wait for its probe
	testenv.Eventually(t, 5*time.Second, "the breaker closes", func() bool { return !m.d.Breaker() })
	failOn(map[string]error{"extend": ErrLeaseLost})
	untilLost := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	res, err = lease.Do(ctx, "k1", untilLost)
	want(t, res, err, LeaseLost)
	for _, r := range lease.Run(ctx, []Item{{Key: "b1"}}, func(ctx context.Context, _ int) error { return untilLost(ctx) }, asBatch) {
		want(t, r.Result, r.Err, LeaseLost)
	}
	failOn(map[string]error{"complete": ErrLeaseLost})
	res, err = lease.Do(ctx, "k2", run("lease"))
	want(t, res, err, LeaseLost)
	failOn(nil)

	ms := m.collect()
	if got := sum(t, ms, "dedup.local.usage", handlerIs("orders")); got != 1 {
		t.Errorf("dedup.local.usage{orders} = %d, want 1 (k1)", got)
	}
	if got, cap := sum(t, ms, "dedup.local.limit", handlerIs("orders")), orders.local.Cap(); got != int64(cap) {
		t.Errorf("dedup.local.limit{orders} = %d, want %d", got, cap)
	}
	if got := sum(t, ms, "dedup.local.usage", handlerIs("nolocal")) + sum(t, ms, "dedup.local.limit", handlerIs("nolocal")); got != 0 {
		t.Errorf("a handler without a local tier reports %d", got)
	}

	// Closed first, as at shutdown: the counters keep their totals for a last export.
	if err := m.d.Close(); err != nil { // waits for background releases
		t.Fatal(err)
	}
	ms = m.collect()
	counts := []struct {
		name string
		kvs  []attribute.KeyValue
		want int64
	}{
		{"dedup.checks", []attribute.KeyValue{handlerIs("orders"), outcomeIs(Processed)}, 1},
		{"dedup.checks", []attribute.KeyValue{handlerIs("orders"), outcomeIs(Duplicate)}, 1},
		{"dedup.checks", []attribute.KeyValue{handlerIs("orders"), outcomeIs(Failed)}, 1},
		{"dedup.checks", []attribute.KeyValue{handlerIs("orders"), outcomeIs(NoKey)}, 1},
		{"dedup.checks", []attribute.KeyValue{handlerIs("orders"), outcomeIs(StoreUnavailable)}, 1},
		{"dedup.checks", []attribute.KeyValue{handlerIs("orders")}, 5},
		{"dedup.checks", []attribute.KeyValue{handlerIs("nolocal"), outcomeIs(Processed)}, 3},
		{"dedup.checks", []attribute.KeyValue{handlerIs("fp"), outcomeIs(KeyReuse)}, 1},
		{"dedup.checks", []attribute.KeyValue{handlerIs("filter"), outcomeIs(First)}, 1},
		{"dedup.checks", []attribute.KeyValue{handlerIs("open"), outcomeIs(Processed)}, 2},
		{"dedup.checks", []attribute.KeyValue{handlerIs("lease"), outcomeIs(LeaseLost)}, 3},
		{"dedup.checks", nil, 17},
		{"dedup.duplicates", []attribute.KeyValue{handlerIs("orders"), attrTier.String("local")}, 1},
		{"dedup.duplicates", []attribute.KeyValue{handlerIs("nolocal"), attrTier.String("store")}, 1},
		{"dedup.duplicates", nil, 2},
		{"dedup.fail_open.runs", []attribute.KeyValue{handlerIs("open")}, 2},
		{"dedup.fail_open.runs", nil, 2},
		{"dedup.key.reused", []attribute.KeyValue{handlerIs("fp")}, 1},
		{"dedup.key.reused", nil, 1},
		{"dedup.key.missing", []attribute.KeyValue{handlerIs("orders")}, 1},
		{"dedup.key.missing", nil, 1},
		{"dedup.lease.lost", []attribute.KeyValue{handlerIs("lease"), opIs("extend")}, 2},
		{"dedup.lease.lost", []attribute.KeyValue{handlerIs("lease"), opIs("complete")}, 1},
		{"dedup.lease.lost", nil, 3},
		// the injected claim failures; lost leases are answers, not errors
		{"dedup.store.errors", []attribute.KeyValue{opIs("claim")}, 3},
		{"dedup.store.errors", nil, 3},
	}
	for _, c := range counts {
		if got := sum(t, ms, c.name, c.kvs...); got != c.want {
			t.Errorf("%s%v = %d, want %d", c.name, c.kvs, got, c.want)
		}
	}
	// one recording per store call the hook store saw
	calls := map[string]int64{
		"claim": m.store.claims.Load(), "complete": m.store.completes.Load(), "release": m.store.releases.Load(),
		"extend": m.store.extends.Load(), "mark": m.store.marks.Load(),
	}
	for op, n := range calls {
		if n == 0 {
			t.Fatalf("the test made no %s call", op)
		}
		if got := observations(t, ms, "dedup.store.duration", opIs(op)); got != uint64(n) {
			t.Errorf("dedup.store.duration{%s} has %d recordings, want %d", op, got, n)
		}
	}
	fnRuns := map[string]uint64{"orders": 2, "nolocal": 3, "fp": 1, "open": 2, "lease": 3, "filter": 0}
	for name, n := range fnRuns {
		if got := observations(t, ms, "dedup.handler.duration", handlerIs(name)); got != n {
			t.Errorf("dedup.handler.duration{%s} has %d recordings, want %d", name, got, n)
		}
	}
	units := map[string]string{
		"dedup.checks": "{check}", "dedup.duplicates": "{duplicate}", "dedup.fail_open.runs": "{run}",
		"dedup.key.reused": "{message}", "dedup.key.missing": "{message}", "dedup.lease.lost": "{lease}",
		"dedup.store.errors": "{error}", "dedup.store.duration": "s", "dedup.handler.duration": "s",
	}
	for name, unit := range units {
		if mt, ok := ms[name]; !ok || mt.Unit != unit || mt.Description == "" {
			t.Errorf("%s: present %v, unit %q, want %q and a description", name, ok, mt.Unit, unit)
		}
	}
	// after Close, the local tiers are gone (a closed cache keeps its Cap)
	if got := sum(t, ms, "dedup.local.limit"); got != 0 {
		t.Errorf("dedup.local.limit = %d after Close", got)
	}
}

// A batch call that fails whole counts one store error; items that fail on their own
// count one each. A caller that cancels its context is not a store error.
func TestMetricsCountAWholeBatchFailureOnceAndCancellationsNever(t *testing.T) {
	m := newMetered(t)
	ctx := context.Background()
	h := m.handler("orders", WithLocalCache(0, 0))
	m.store.onFail(func(op string) error {
		if op == "claim-many" {
			return fmt.Errorf("%w: injected", ErrStoreUnavailable)
		}
		return nil
	})
	for _, r := range h.Run(ctx, []Item{{Key: "a"}, {Key: "b"}, {Key: "c"}}, func(context.Context, int) error { return nil }) {
		want(t, r.Result, r.Err, StoreUnavailable)
	}
	m.store.onFail(func(string) error { return nil })

	// item errors, straight through the metered store
	items := &allItemsFailStore{Store: m.d.base}
	ms := m.d.met.Store(items)
	entries := []driver.Entry{{Key: "x:orders:1", Token: "t", TTL: time.Minute}, {Key: "x:orders:2", Token: "t", TTL: time.Minute}}
	if _, err := ms.Claim(ctx, entries); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	m.store.onFail(func(string) error { return context.Canceled })
	res, err := h.Do(cctx, "d", ok)
	want(t, res, err, Cancelled)
	m.store.onFail(func(string) error { return nil })

	got := m.collect()
	if n := sum(t, got, "dedup.store.errors", opIs("claim")); n != 1+2 {
		t.Errorf("dedup.store.errors{claim} = %d, want 1 (a failed batch) + 2 (failed items), and none for a cancelled caller", n)
	}
}

// allItemsFailStore fails every item of a Claim on its own.
type allItemsFailStore struct{ driver.Store }

func (s *allItemsFailStore) Claim(_ context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	out := make([]driver.Answer, len(entries))
	for i := range out {
		out[i].Err = fmt.Errorf("%w: item", ErrStoreUnavailable)
	}
	return out, nil
}

// Without a meter provider nothing is instrumented: the store is called directly,
// handlers carry no metrics, and a local hit still allocates nothing.
func TestWithoutAMeterProviderNothingIsInstrumented(t *testing.T) {
	mem, _ := memstore.New()
	d, err := New(mem, WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	h, err := d.Register("orders")
	if err != nil {
		t.Fatal(err)
	}
	if d.met != nil || h.met != nil || d.store.(*batcher.Store).Unwrap() != driver.Store(mem) || d.Store() != driver.Store(mem) {
		t.Fatalf("metrics are on without a provider: %T, %v, %v", d.store.(*batcher.Store).Unwrap(), d.met != nil, h.met != nil)
	}
	if _, err := New(mem, WithMeterProvider(nil)); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("a nil provider: %v, want ErrInvalidOption", err)
	}
}

// With metrics on, Store still returns the store given to New, and a local hit still
// allocates nothing (the attribute sets are built at Register).
func TestMetricsKeepTheLocalHitAllocationFree(t *testing.T) {
	m := newMetered(t)
	h := m.handler("orders")
	ctx := context.Background()
	if m.d.Store() != m.d.base || m.d.Store() == m.d.store {
		t.Fatal("Store returns the metered wrapper")
	}
	res, err := h.Do(ctx, "order-42", ok)
	want(t, res, err, Processed)
	allocs := testing.AllocsPerRun(1000, func() {
		if res, _ := h.Do(ctx, "order-42", ok); res.Tier != TierLocal {
			t.Fatal("not a local hit")
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocs per local hit with metrics on", allocs)
	}
	if got := sum(t, m.collect(), "dedup.duplicates", attrTier.String("local")); got < 1000 {
		t.Fatalf("%d local duplicates counted", got)
	}
}

// The stored replies' counters: a reply too large to store, and the duplicate then
// answered without one, for handlers WithReplies (and for them only); a completion
// with a reply is timed as a complete.
func TestMetricsCountRepliesTooLargeToStore(t *testing.T) {
	mem, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	m := &metered{t: t, reader: reader}
	if m.d, err = New(mem, WithLogger(quiet), WithMeterProvider(mp)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.d.Close() })
	ctx := context.Background()
	h := m.handler("replies", WithReplies(4))
	m.handler("plain")
	large := func(context.Context) ([]byte, error) { return []byte("12345"), nil }
	small := func(context.Context) ([]byte, error) { return []byte("1234"), nil }
	if res, err := runReply(h, ctx, "k1", nil, large); res.Outcome != Processed || !errors.Is(err, ErrReplyTooLarge) {
		t.Fatalf("too large: %+v %v", res, err)
	}
	if res, _ := runReply(h, ctx, "k1", nil, large); res.Outcome != Duplicate || res.HasReply {
		t.Fatalf("duplicate: %+v", res)
	}
	if res, err := runReply(h, ctx, "k2", nil, small); res.Outcome != Processed || err != nil {
		t.Fatalf("stored: %+v %v", res, err)
	}
	ms := m.collect()
	for _, c := range []struct {
		name string
		kvs  []attribute.KeyValue
		want int64
	}{
		{"dedup.replies.too_large", []attribute.KeyValue{handlerIs("replies")}, 1},
		{"dedup.replies.missing", []attribute.KeyValue{handlerIs("replies")}, 1},
		{"dedup.replies.too_large", []attribute.KeyValue{handlerIs("plain")}, 0},
		{"dedup.checks", []attribute.KeyValue{handlerIs("replies"), outcomeIs(Processed)}, 2},
	} {
		if got := sum(t, ms, c.name, c.kvs...); got != c.want {
			t.Errorf("%s%v = %d, want %d", c.name, c.kvs, got, c.want)
		}
	}
	for name, unit := range map[string]string{"dedup.replies.too_large": "{reply}", "dedup.replies.missing": "{duplicate}"} {
		if mt, ok := ms[name]; !ok || mt.Unit != unit || mt.Description == "" {
			t.Errorf("%s: present %v, unit %q, want %q and a description", name, ok, mt.Unit, unit)
		}
	}
	if got := observations(t, ms, "dedup.store.duration", opIs("complete")); got != 2 {
		t.Errorf("dedup.store.duration{complete} has %d recordings, want 2 (one with a reply)", got)
	}
}
