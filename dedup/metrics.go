package dedup

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/dedupkit/dedupkit/dedup/internal/meter"
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

// instrument creates the Deduper's instruments (internal/meter) and puts the store
// behind a metered wrapper. It does nothing without a meter provider.
func (d *Deduper) instrument() error {
	if d.cfg.meterProvider == nil {
		return nil
	}
	outcomes := make([]string, numOutcomes-Processed) // from Processed on: not the zero Outcome
	for i := range outcomes {
		outcomes[i] = strings.ReplaceAll((Processed + Outcome(i)).String(), "-", "_")
	}
	m, err := meter.New(d.cfg.meterProvider, outcomes, d.snapshots)
	if err != nil {
		return err
	}
	d.met = m
	d.store = m.Store(d.store)
	return nil
}

// snapshots hands f every handler's counters (Stats) and, until Close, local tier fill.
func (d *Deduper) snapshots(f func(meter.Snapshot)) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	for _, h := range d.handlers {
		if h.met == nil {
			continue
		}
		s := h.Stats()
		snap := meter.Snapshot{Handler: h.met, Outcomes: make([]uint64, numOutcomes-Processed),
			Local: s.LocalDuplicates, Store: s.StoreDuplicates, Database: s.DatabaseDuplicates,
			KeyReused: s.Count(KeyReuse), Replies: h.cfg.replyLimit > 0,
			TooLarge: s.RepliesTooLarge, Missing: s.RepliesMissing,
			LocalTier: h.local != nil && !d.closed}
		for i := range snap.Outcomes {
			snap.Outcomes[i] = s.Count(Processed + Outcome(i))
		}
		if snap.LocalTier {
			snap.Len, snap.Cap = h.local.Len(), h.local.Cap()
		}
		f(snap)
	}
}

// invoke runs fn, recovering a panic, and times it when metrics are on.
func (h *Handler) invoke(ctx context.Context, fn func(context.Context) error) (panicked bool, err error) {
	if h.met == nil {
		return invoke(ctx, fn)
	}
	start := time.Now()
	panicked, err = invoke(ctx, fn)
	h.met.Ran(start)
	return panicked, err
}
