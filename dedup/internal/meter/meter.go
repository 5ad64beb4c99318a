// Package meter is a Deduper's OpenTelemetry instruments (dedup.WithMeterProvider;
// the list is in docs/operating.md): a store wrapper that times every call and
// counts its failures, a few counters the engine adds to, and a callback that reads
// the handlers' counters when the provider collects.
package meter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/dedupkit/dedupkit/dedup/driver"
)

// Name is the instrumentation scope of every instrument.
const Name = "github.com/dedupkit/dedupkit/dedup"

// Attribute keys of the instruments.
const (
	attrHandler   = attribute.Key("dedup.handler.name")   // the handler's name
	attrOutcome   = attribute.Key("dedup.outcome")        // an outcome, in snake_case: "store_unavailable"
	attrTier      = attribute.Key("dedup.tier")           // "local", "store" or "database"
	attrOperation = attribute.Key("dedup.operation.name") // a driver.Store method in snake_case: "claim"
)

// Store operations, named by opNames as dedup.operation.name values.
const (
	opClaim = iota
	// OpComplete and OpExtend are the operations that find a lease lost.
	OpComplete
	opRelease
	OpExtend
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

// Metrics holds a Deduper's instruments.
type Metrics struct {
	outcomes []string // the outcomes' attribute values, by outcome

	failOpen, keyMissing, leaseLost, storeErrors metric.Int64Counter
	handlerDur, storeDur                         metric.Float64Histogram
	// read from the handlers' counters when collected: a check costs no more with metrics
	checks, duplicates, keyReused   metric.Int64ObservableCounter
	repliesTooLarge, repliesMissing metric.Int64ObservableCounter
	localUsage, localLimit          metric.Int64ObservableUpDownCounter

	opRecord [numOps][]metric.RecordOption
	opAdd    [numOps][]metric.AddOption
}

// Snapshot is one handler's counters, as the collect callback reads them.
type Snapshot struct {
	Handler  *Handler
	Outcomes []uint64 // checks by outcome, indexed as New's outcomes
	// Duplicates by tier; Database is observed only when not 0 (transactional handlers)
	Local, Store, Database uint64
	KeyReused              uint64
	Replies                bool // the handler stores replies: the replies' counters are observed
	TooLarge, Missing      uint64
	LocalTier              bool // the handler has a local tier, and the Deduper is open
	Len, Cap               int
}

// New creates the instruments on mp. outcomes are the outcomes' attribute values,
// by outcome; each hands the collect callback a Snapshot of every handler.
func New(mp metric.MeterProvider, outcomes []string, each func(func(Snapshot))) (*Metrics, error) {
	meter := mp.Meter(Name)
	m := &Metrics{outcomes: outcomes}
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
		return nil, fmt.Errorf("dedup: creating instruments: %w", err)
	}
	for op := range numOps {
		o := metric.WithAttributeSet(attribute.NewSet(attrOperation.String(opNames[op])))
		m.opRecord[op] = []metric.RecordOption{o}
		m.opAdd[op] = []metric.AddOption{o}
	}
	// Never unregistered: after Close the counters keep their final totals, so that a
	// provider shut down after the Deduper still exports them.
	if _, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		each(func(s Snapshot) { m.observe(o, s) })
		return nil
	}, m.checks, m.duplicates, m.keyReused, m.repliesTooLarge, m.repliesMissing, m.localUsage, m.localLimit); err != nil {
		return nil, fmt.Errorf("dedup: registering the metrics callback: %w", err)
	}
	return m, nil
}

// observe reports one handler's counters.
func (m *Metrics) observe(o metric.Observer, s Snapshot) {
	hm := s.Handler
	for oc, n := range s.Outcomes {
		o.ObserveInt64(m.checks, int64(n), hm.outcome[oc]...)
	}
	o.ObserveInt64(m.duplicates, int64(s.Local), hm.local...)
	o.ObserveInt64(m.duplicates, int64(s.Store), hm.store...)
	if s.Database > 0 { // transactional handlers only: not a zero series for every handler
		o.ObserveInt64(m.duplicates, int64(s.Database), hm.database...)
	}
	o.ObserveInt64(m.keyReused, int64(s.KeyReused), hm.observed...)
	if s.Replies {
		o.ObserveInt64(m.repliesTooLarge, int64(s.TooLarge), hm.observed...)
		o.ObserveInt64(m.repliesMissing, int64(s.Missing), hm.observed...)
	}
	if s.LocalTier {
		o.ObserveInt64(m.localUsage, int64(s.Len), hm.observed...)
		o.ObserveInt64(m.localLimit, int64(s.Cap), hm.observed...)
	}
}

// Handler is a handler's attribute sets, built once at Register. A nil *Handler
// (metrics off) records nothing.
type Handler struct {
	m        *Metrics
	handler  []metric.AddOption
	record   []metric.RecordOption
	lostBy   [numOps][]metric.AddOption // lease lost, by operation (extend, complete)
	observed []metric.ObserveOption
	outcome  [][]metric.ObserveOption
	local    []metric.ObserveOption // duplicates, tier local
	store    []metric.ObserveOption // duplicates, tier store
	database []metric.ObserveOption // duplicates, tier database
}

// Handler builds the attribute sets of handler name; nil when m is.
func (m *Metrics) Handler(name string) *Handler {
	if m == nil {
		return nil
	}
	hn := attrHandler.String(name)
	set := func(kv ...attribute.KeyValue) metric.MeasurementOption {
		return metric.WithAttributeSet(attribute.NewSet(append(kv, hn)...))
	}
	add := func(kv ...attribute.KeyValue) []metric.AddOption { return []metric.AddOption{set(kv...)} }
	observe := func(kv ...attribute.KeyValue) []metric.ObserveOption { return []metric.ObserveOption{set(kv...)} }
	hm := &Handler{m: m, outcome: make([][]metric.ObserveOption, len(m.outcomes))}
	for o, name := range m.outcomes {
		hm.outcome[o] = observe(attrOutcome.String(name))
	}
	hm.local = observe(attrTier.String("local"))
	hm.store = observe(attrTier.String("store"))
	hm.database = observe(attrTier.String("database"))
	hm.handler = add()
	hm.lostBy[OpExtend] = add(attrOperation.String(opNames[OpExtend]))
	hm.lostBy[OpComplete] = add(attrOperation.String(opNames[OpComplete]))
	hm.record = []metric.RecordOption{set()}
	hm.observed = observe()
	return hm
}

// FailOpen counts a message let through without dedup.
func (hm *Handler) FailOpen() {
	if hm != nil {
		hm.m.failOpen.Add(context.Background(), 1, hm.handler...)
	}
}

// KeyMissing counts a message without a key.
func (hm *Handler) KeyMissing() {
	if hm != nil {
		hm.m.keyMissing.Add(context.Background(), 1, hm.handler...)
	}
}

// LeaseLost counts a lease found lost by op (OpExtend or OpComplete).
func (hm *Handler) LeaseLost(op int) {
	if hm != nil {
		hm.m.leaseLost.Add(context.Background(), 1, hm.lostBy[op]...)
	}
}

// Ran records how long an fn that started at start ran.
func (hm *Handler) Ran(start time.Time) {
	if hm != nil {
		hm.m.handlerDur.Record(context.Background(), time.Since(start).Seconds(), hm.record...)
	}
}

// Store times every call to s and counts its failures. The Deduper puts it in front
// of its store only when metrics are on.
func (m *Metrics) Store(s driver.Store) driver.Store { return &store{s: s, m: m} }

type store struct {
	s driver.Store
	m *Metrics
}

// done records one call of op that started at start and ended with err, plus
// itemErrs failed items of a batch that did not fail whole.
func (s *store) done(ctx context.Context, op int, start time.Time, err error, itemErrs int) {
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
	case err == nil, errors.Is(err, driver.ErrLeaseLost):
		return false
	case errors.Is(ctx.Err(), context.Canceled):
		return false
	}
	return true
}

// count is how many of errs are store errors.
func count[T any](ctx context.Context, items []T, errOf func(T) error) int {
	n := 0
	for _, it := range items {
		if isStoreError(ctx, errOf(it)) {
			n++
		}
	}
	return n
}

func answerErr(a driver.Answer) error { return a.Err }

// recordErr is a record's error; one left alone because it is IN PROGRESS is an
// answer, not a store error.
func recordErr(r driver.Record) error {
	if errors.Is(r.Err, driver.ErrRecordInProgress) {
		return nil
	}
	return r.Err
}

func (s *store) Claim(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	start := time.Now()
	as, err := s.s.Claim(ctx, entries)
	s.done(ctx, opClaim, start, err, count(ctx, as, answerErr))
	return as, err
}

func (s *store) Mark(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	start := time.Now()
	as, err := s.s.Mark(ctx, entries)
	s.done(ctx, opMark, start, err, count(ctx, as, answerErr))
	return as, err
}

func (s *store) Complete(ctx context.Context, entries []driver.Entry) ([]error, error) {
	return s.settle(ctx, OpComplete, entries, s.s.Complete)
}

func (s *store) Extend(ctx context.Context, entries []driver.Entry) ([]error, error) {
	return s.settle(ctx, OpExtend, entries, s.s.Extend)
}

func (s *store) Release(ctx context.Context, entries []driver.Entry) ([]error, error) {
	return s.settle(ctx, opRelease, entries, s.s.Release)
}

func (s *store) settle(ctx context.Context, op int, entries []driver.Entry, f func(context.Context, []driver.Entry) ([]error, error)) ([]error, error) {
	start := time.Now()
	errs, err := f(ctx, entries)
	s.done(ctx, op, start, err, count(ctx, errs, func(e error) error { return e }))
	return errs, err
}

// Lookup implements driver.RecordStore when the store does (the caller checks).
func (s *store) Lookup(ctx context.Context, keys []string) ([]driver.Record, error) {
	start := time.Now()
	rs, err := s.s.(driver.RecordStore).Lookup(ctx, keys)
	s.done(ctx, opLookup, start, err, count(ctx, rs, recordErr))
	return rs, err
}

// Forget implements driver.RecordStore when the store does (the caller checks).
func (s *store) Forget(ctx context.Context, keys []string, force bool) ([]driver.Record, error) {
	start := time.Now()
	rs, err := s.s.(driver.RecordStore).Forget(ctx, keys, force)
	s.done(ctx, opForget, start, err, count(ctx, rs, recordErr))
	return rs, err
}

// CountRecords implements driver.RecordStore when the store does.
func (s *store) CountRecords(ctx context.Context, prefix, handler string) (map[string]int64, error) {
	start := time.Now()
	n, err := s.s.(driver.RecordStore).CountRecords(ctx, prefix, handler)
	s.done(ctx, opCount, start, err, 0)
	return n, err
}
