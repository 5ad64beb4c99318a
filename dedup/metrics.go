package dedup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/dedupkit/dedupkit/dedup/driver"
)

// meterName is the instrumentation scope of every instrument a Deduper creates.
const meterName = "github.com/dedupkit/dedupkit/dedup"

// Attribute keys of the instruments (see WithMeterProvider).
const (
	attrHandler   = attribute.Key("dedup.handler.name")   // the handler's name
	attrOutcome   = attribute.Key("dedup.outcome")        // Outcome, in snake_case: "store_unavailable"
	attrTier      = attribute.Key("dedup.tier")           // Tier: "local" or "store"
	attrOperation = attribute.Key("dedup.operation.name") // a driver.Store method in snake_case: "claim"
)

// Store operations, named by opNames as dedup.operation.name values.
const (
	opClaim = iota
	opComplete
	opRelease
	opExtend
	opMark
	opLookup
	opForget
	opCount
	numOps
)

var opNames = [numOps]string{"claim", "complete", "release", "extend", "mark", "lookup", "forget", "count"}

// Bucket boundaries, in seconds. A Redis round trip is tens of microseconds to a few
// milliseconds; a handler's fn runs for anything up to its lease and beyond.
var (
	storeBuckets   = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}
	handlerBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}
)

// WithMeterProvider turns on OpenTelemetry metrics, recorded through mp under the
// scope "github.com/dedupkit/dedupkit/dedup" (default: none, and metrics then cost
// nothing). Pass otel.GetMeterProvider() for the global provider. The counts of
// checks by outcome, duplicates and reused keys are read from the handlers' Stats
// when collected, so a check costs the same with metrics on. A nil mp is an error
// wrapping ErrInvalidOption. The instruments are listed in docs/operating.md.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) error {
		if mp == nil {
			return fmt.Errorf("%w: meter provider is nil", ErrInvalidOption)
		}
		c.meterProvider = mp
		return nil
	}
}

// metrics holds a Deduper's instruments; nil when metrics are off.
type metrics struct {
	failOpen, keyMissing, leaseLost, storeErrors metric.Int64Counter
	handlerDur, storeDur                         metric.Float64Histogram
	// read from the handlers' Stats when collected: a check costs no more with metrics
	checks, duplicates, keyReused   metric.Int64ObservableCounter
	repliesTooLarge, repliesMissing metric.Int64ObservableCounter
	localUsage, localLimit          metric.Int64ObservableUpDownCounter

	opRecord [numOps][]metric.RecordOption
	opAdd    [numOps][]metric.AddOption
}

// handlerMetrics is a handler's attribute sets, built once at Register; nil when off.
type handlerMetrics struct {
	m        *metrics
	handler  []metric.AddOption
	record   []metric.RecordOption
	lostBy   [numOps][]metric.AddOption // lease lost, by operation (extend, complete)
	observed []metric.ObserveOption
	outcome  [numOutcomes][]metric.ObserveOption
	local    []metric.ObserveOption // duplicates, tier local
	store    []metric.ObserveOption // duplicates, tier store
	database []metric.ObserveOption // duplicates, tier database
}

// instrument creates the Deduper's instruments and puts the store behind a metered
// wrapper. It does nothing without a meter provider.
func (d *Deduper) instrument() error {
	mp := d.cfg.meterProvider
	if mp == nil {
		return nil
	}
	meter := mp.Meter(meterName)
	m := &metrics{}
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	histogram := func(name, desc string, buckets []float64) metric.Float64Histogram {
		h, err := meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(buckets...))
		errs = append(errs, err)
		return h
	}
	observed := func(name, unit, desc string) metric.Int64ObservableCounter {
		c, err := meter.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	gauge := func(name, desc string) metric.Int64ObservableUpDownCounter {
		g, err := meter.Int64ObservableUpDownCounter(name, metric.WithUnit("{entry}"), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	m.checks = observed("dedup.checks", "{check}", "Calls by handler and final outcome.")
	m.duplicates = observed("dedup.duplicates", "{duplicate}", "Duplicates by the tier that recognised them.")
	m.keyReused = observed("dedup.key.reused", "{message}", "Messages whose key is DONE with another payload fingerprint.")
	m.repliesTooLarge = observed("dedup.replies.too_large", "{reply}", "Replies larger than the handler's limit: processed, not stored.")
	m.repliesMissing = observed("dedup.replies.missing", "{duplicate}", "Duplicates of reply forms answered without a reply: their DONE record holds none.")
	m.failOpen = counter("dedup.fail_open.runs", "{run}", "Messages let through without dedup because the store failed (FailOpen).")
	m.keyMissing = counter("dedup.key.missing", "{message}", "Messages without a key.")
	m.leaseLost = counter("dedup.lease.lost", "{lease}", "Leases found lost, by the operation that found it (extend: the heartbeat; complete).")
	m.storeErrors = counter("dedup.store.errors", "{error}", "Failed store calls, by operation.")
	m.handlerDur = histogram("dedup.handler.duration", "How long the handler's fn ran.", handlerBuckets)
	m.storeDur = histogram("dedup.store.duration", "How long a store call took, by operation.", storeBuckets)
	m.localUsage = gauge("dedup.local.usage", "Keys held by a handler's local tier.")
	m.localLimit = gauge("dedup.local.limit", "Keys a handler's local tier can hold.")
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("dedup: creating instruments: %w", err)
	}
	for op := range numOps {
		o := metric.WithAttributeSet(attribute.NewSet(attrOperation.String(opNames[op])))
		m.opRecord[op] = []metric.RecordOption{o}
		m.opAdd[op] = []metric.AddOption{o}
	}
	// Never unregistered: after Close the counters keep their final totals, so that a
	// provider shut down after the Deduper still exports them.
	if _, err := meter.RegisterCallback(d.observe, m.checks, m.duplicates, m.keyReused, m.repliesTooLarge, m.repliesMissing,
		m.localUsage, m.localLimit); err != nil {
		return fmt.Errorf("dedup: registering the metrics callback: %w", err)
	}
	d.met = m
	d.store = &meteredStore{s: d.store, m: m}
	return nil
}

// observe reports every handler's counters (Stats) and, until Close, local tier fill.
func (d *Deduper) observe(_ context.Context, o metric.Observer) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	m := d.met
	for _, h := range d.handlers {
		hm := h.met
		if hm == nil {
			continue
		}
		s := h.Stats()
		for oc := Processed; oc < numOutcomes; oc++ {
			o.ObserveInt64(m.checks, int64(s.Count(oc)), hm.outcome[oc]...)
		}
		o.ObserveInt64(m.duplicates, int64(s.LocalDuplicates), hm.local...)
		o.ObserveInt64(m.duplicates, int64(s.StoreDuplicates), hm.store...)
		if s.DatabaseDuplicates > 0 { // transactional handlers only: not a zero series for every handler
			o.ObserveInt64(m.duplicates, int64(s.DatabaseDuplicates), hm.database...)
		}
		o.ObserveInt64(m.keyReused, int64(s.Count(KeyReuse)), hm.observed...)
		if h.cfg.replyLimit > 0 { // handlers with stored replies only
			o.ObserveInt64(m.repliesTooLarge, int64(s.RepliesTooLarge), hm.observed...)
			o.ObserveInt64(m.repliesMissing, int64(s.RepliesMissing), hm.observed...)
		}
		if h.local != nil && !d.closed {
			o.ObserveInt64(m.localUsage, int64(h.local.Len()), hm.observed...)
			o.ObserveInt64(m.localLimit, int64(h.local.Cap()), hm.observed...)
		}
	}
	return nil
}

// forHandler builds a handler's attribute sets; nil when metrics are off.
func (m *metrics) forHandler(name string) *handlerMetrics {
	if m == nil {
		return nil
	}
	hn := attrHandler.String(name)
	set := func(kv ...attribute.KeyValue) metric.MeasurementOption {
		return metric.WithAttributeSet(attribute.NewSet(append(kv, hn)...))
	}
	add := func(kv ...attribute.KeyValue) []metric.AddOption { return []metric.AddOption{set(kv...)} }
	observe := func(kv ...attribute.KeyValue) []metric.ObserveOption { return []metric.ObserveOption{set(kv...)} }
	hm := &handlerMetrics{m: m}
	for o := range numOutcomes {
		hm.outcome[o] = observe(attrOutcome.String(outcomeAttr(Outcome(o))))
	}
	hm.local = observe(attrTier.String(TierLocal.String()))
	hm.store = observe(attrTier.String(TierStore.String()))
	hm.database = observe(attrTier.String(TierDatabase.String()))
	hm.handler = add()
	hm.lostBy[opExtend] = add(attrOperation.String(opNames[opExtend]))
	hm.lostBy[opComplete] = add(attrOperation.String(opNames[opComplete]))
	hm.record = []metric.RecordOption{set()}
	hm.observed = observe()
	return hm
}

func outcomeAttr(o Outcome) string { return strings.ReplaceAll(o.String(), "-", "_") }

// failOpen counts a message let through without dedup. Safe on nil.
func (hm *handlerMetrics) failOpen() {
	if hm != nil {
		hm.m.failOpen.Add(context.Background(), 1, hm.handler...)
	}
}

// keyMissing counts a message without a key. Safe on nil.
func (hm *handlerMetrics) keyMissing() {
	if hm != nil {
		hm.m.keyMissing.Add(context.Background(), 1, hm.handler...)
	}
}

// leaseLost counts a lease found lost by op (opExtend or opComplete). Safe on nil.
func (hm *handlerMetrics) leaseLost(op int) {
	if hm != nil {
		hm.m.leaseLost.Add(context.Background(), 1, hm.lostBy[op]...)
	}
}

// invoke runs fn, recovering a panic, and times it when metrics are on.
func (h *Handler) invoke(ctx context.Context, fn func(context.Context) error) (panicked bool, err error) {
	if h.met == nil {
		return invoke(ctx, fn)
	}
	start := time.Now()
	panicked, err = invoke(ctx, fn)
	h.met.m.handlerDur.Record(context.Background(), time.Since(start).Seconds(), h.met.record...)
	return panicked, err
}

// meteredStore times every call to the store and counts its failures. The Deduper
// puts it in front of its store only when metrics are on.
type meteredStore struct {
	s driver.Store
	m *metrics
}

var _ driver.Store = (*meteredStore)(nil)

// done records one call of op that started at start and ended with err, plus
// itemErrs failed items of a batch that did not fail whole.
func (s *meteredStore) done(ctx context.Context, op int, start time.Time, err error, itemErrs int) {
	s.m.storeDur.Record(context.Background(), time.Since(start).Seconds(), s.m.opRecord[op]...)
	n := itemErrs
	if isStoreError(ctx, err) {
		n = 1
	}
	if n > 0 {
		s.m.storeErrors.Add(context.Background(), int64(n), s.m.opAdd[op]...)
	}
}

// isStoreError tells a store failure from an answer (a lost lease) and from a caller
// that gave up (context cancelled; a passed deadline is the store's slowness).
func isStoreError(ctx context.Context, err error) bool {
	switch {
	case err == nil, errors.Is(err, ErrLeaseLost):
		return false
	case errors.Is(ctx.Err(), context.Canceled):
		return false
	}
	return true
}

// Claim implements Store.
func (s *meteredStore) Claim(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	start := time.Now()
	as, err := s.s.Claim(ctx, entries)
	s.done(ctx, opClaim, start, err, answerErrs(ctx, as))
	return as, err
}

// Mark implements Store.
func (s *meteredStore) Mark(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	start := time.Now()
	as, err := s.s.Mark(ctx, entries)
	s.done(ctx, opMark, start, err, answerErrs(ctx, as))
	return as, err
}

// Complete implements Store.
func (s *meteredStore) Complete(ctx context.Context, entries []driver.Entry) ([]error, error) {
	return s.settle(ctx, opComplete, entries, s.s.Complete)
}

// Extend implements Store.
func (s *meteredStore) Extend(ctx context.Context, entries []driver.Entry) ([]error, error) {
	return s.settle(ctx, opExtend, entries, s.s.Extend)
}

// Release implements Store.
func (s *meteredStore) Release(ctx context.Context, entries []driver.Entry) ([]error, error) {
	return s.settle(ctx, opRelease, entries, s.s.Release)
}

func (s *meteredStore) settle(ctx context.Context, op int, entries []driver.Entry, f func(context.Context, []driver.Entry) ([]error, error)) ([]error, error) {
	start := time.Now()
	errs, err := f(ctx, entries)
	n := 0
	for _, e := range errs {
		if isStoreError(ctx, e) {
			n++
		}
	}
	s.done(ctx, op, start, err, n)
	return errs, err
}

func answerErrs(ctx context.Context, as []driver.Answer) int {
	n := 0
	for _, a := range as {
		if isStoreError(ctx, a.Err) {
			n++
		}
	}
	return n
}

// Lookup implements RecordStore when the store does (Deduper.records checks).
func (s *meteredStore) Lookup(ctx context.Context, keys []string) ([]driver.Record, error) {
	start := time.Now()
	rs, err := s.s.(driver.RecordStore).Lookup(ctx, keys)
	s.done(ctx, opLookup, start, err, recordErrs(ctx, rs))
	return rs, err
}

// Forget implements RecordStore when the store does (Deduper.records checks). A
// record left alone because it is IN PROGRESS is an answer, not a store error.
func (s *meteredStore) Forget(ctx context.Context, keys []string, force bool) ([]driver.Record, error) {
	start := time.Now()
	rs, err := s.s.(driver.RecordStore).Forget(ctx, keys, force)
	s.done(ctx, opForget, start, err, recordErrs(ctx, rs))
	return rs, err
}

// CountRecords implements RecordStore when the store does (Deduper.records checks).
func (s *meteredStore) CountRecords(ctx context.Context, prefix, handler string) (map[string]int64, error) {
	start := time.Now()
	n, err := s.s.(driver.RecordStore).CountRecords(ctx, prefix, handler)
	s.done(ctx, opCount, start, err, 0)
	return n, err
}

func recordErrs(ctx context.Context, rs []driver.Record) int {
	n := 0
	for _, r := range rs {
		if isStoreError(ctx, r.Err) && !errors.Is(r.Err, ErrRecordInProgress) {
			n++
		}
	}
	return n
}
