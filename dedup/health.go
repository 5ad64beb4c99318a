package dedup

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/internal/storekit"
)

// LocalTierHealth is the fill of one handler's local tier.
type LocalTierHealth struct {
	Handler string `json:"handler"`
	Len     int    `json:"len"` // keys held, expired ones not yet reclaimed included
	Cap     int    `json:"cap"` // 0: no local tier
}

// HealthReport is what Deduper.Health found.
type HealthReport struct {
	// Status is the worst of the checks' statuses (unknown counts as ok).
	Status driver.HealthStatus `json:"status"`
	// Checks are the Deduper's own findings, then the store's.
	Checks []driver.HealthCheck `json:"checks"`
	// Local is every handler's local tier, sorted by handler name.
	Local []LocalTierHealth `json:"local"`
}

const defaultHealthTimeout = 2 * time.Second

// Health reports whether the Deduper is closed, the store's own checks (when it
// implements driver.HealthChecker) and the fill of every local tier. It writes
// nothing; ctx bounds the store's checks.
func (d *Deduper) Health(ctx context.Context) HealthReport {
	var rep HealthReport
	if d == nil || d.handlers == nil {
		return HealthReport{Status: driver.HealthFail, Checks: []driver.HealthCheck{{Name: driver.CheckDeduper, Status: driver.HealthFail, Detail: "nil *Deduper (did New fail?)"}}}
	}
	if ctx == nil {
		ctx = context.Background()
	}
	d.mu.RLock()
	closed := d.closed
	hs := make([]*Handler, 0, len(d.handlers))
	for _, h := range d.handlers {
		hs = append(hs, h)
	}
	d.mu.RUnlock()
	if closed {
		rep.Checks = append(rep.Checks, driver.HealthCheck{Name: driver.CheckDeduper, Status: driver.HealthFail, Detail: "the Deduper is closed"})
	}
	if hc, ok := d.base.(driver.HealthChecker); ok {
		rep.Checks = append(rep.Checks, d.g.CheckHealth(ctx, hc)...)
	} else {
		rep.Checks = append(rep.Checks, driver.HealthCheck{Name: driver.CheckStoreReachable, Status: driver.HealthUnknown,
			Detail: fmt.Sprintf("the store (%T) does not report its health", d.base)})
	}
	if c, ok := d.noticeHealth(); ok && !closed {
		rep.Checks = append(rep.Checks, c)
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i].name < hs[j].name })
	rep.Local = make([]LocalTierHealth, 0, len(hs))
	for _, h := range hs {
		l := LocalTierHealth{Handler: h.name}
		if h.local != nil && !closed {
			l.Len, l.Cap = h.local.Len(), h.local.Cap()
		}
		rep.Local = append(rep.Local, l)
	}
	rep.Status = storekit.Worst(rep.Checks)
	return rep
}

// HealthHandler returns an http.Handler that writes Health's report as JSON, with
// status 200 for ok or warn and 503 for fail. Each request is bounded to 2s.
func (d *Deduper) HealthHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), defaultHealthTimeout)
		defer cancel()
		rep := d.Health(ctx)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		code := http.StatusOK
		if rep.Status == driver.HealthFail {
			code = http.StatusServiceUnavailable
		}
		w.WriteHeader(code)
		if r.Method != http.MethodHead {
			_ = json.NewEncoder(w).Encode(rep)
		}
	})
}
