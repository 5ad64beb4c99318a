package dedup

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
)

// LocalTierHealth is the fill of one handler's local tier.
type LocalTierHealth struct {
	Handler string `json:"handler"`
	// Len is the number of keys held (expired ones not yet reclaimed included).
	Len int `json:"len"`
	// Cap is the most keys the tier holds; 0 when the handler has no local tier.
	Cap int `json:"cap"`
}

// HealthReport is what Deduper.Health found.
type HealthReport struct {
	// Status is the worst of the checks' statuses: fail, else warn, else ok
	// (unknown counts as ok).
	Status driver.HealthStatus `json:"status"`
	// Checks are the findings: the Deduper's own, then the store's.
	Checks []driver.HealthCheck `json:"checks"`
	// Local is every handler's local tier, by handler name. A full tier is normal (it
	// evicts the least recently used keys); Len well below Cap for long means the
	// tier is larger than needed.
	Local []LocalTierHealth `json:"local"`
}

// defaultHealthTimeout bounds one request to HealthHandler.
const defaultHealthTimeout = 2 * time.Second

// Health checks the Deduper and its store: whether the Deduper is closed, the store's
// own checks (when it implements HealthChecker; otherwise CheckStoreReachable is
// HealthUnknown) and the fill of every local tier. It makes no call on the data path
// and writes nothing. ctx bounds the store's checks.
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
		rep.Checks = append(rep.Checks, d.storeHealth(ctx, hc)...)
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
	rep.Status = worst(rep.Checks)
	return rep
}

// storeHealth is hc's checks, or, when they are not in shortly after ctx's deadline
// (a store that does not answer, through a client that does not honour ctx),
// CheckStoreReachable failed. The grace lets a store that honours ctx report its own
// failed checks, which name the server.
func (d *Deduper) storeHealth(ctx context.Context, hc driver.HealthChecker) []driver.HealthCheck {
	wait := ctx
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		wait, cancel = context.WithDeadline(context.WithoutCancel(ctx), dl.Add(healthGrace))
		defer cancel()
	}
	checks, err := detached(&guard{d: d, detach: detaches(d.base)}, waitBounded(ctx, wait), "health", false, func(ctx context.Context) ([]driver.HealthCheck, error) {
		return hc.CheckHealth(ctx), nil
	}, nil)
	if err != nil {
		return []driver.HealthCheck{{Name: driver.CheckStoreReachable, Status: driver.HealthFail, Detail: err.Error()}}
	}
	return checks
}

// healthGrace is how long after its deadline Health waits for a store's own checks.
const healthGrace = 50 * time.Millisecond

func worst(cs []driver.HealthCheck) driver.HealthStatus {
	s := driver.HealthOK
	for _, c := range cs {
		switch c.Status {
		case driver.HealthFail:
			return driver.HealthFail
		case driver.HealthWarn:
			s = driver.HealthWarn
		}
	}
	return s
}

// HealthHandler returns an http.Handler that runs Health, bounded by the request's
// context and a 2s timeout, and writes the HealthReport as JSON: status 200
// when the report's Status is ok or warn, 503 when it is fail. Mount it on a mux:
//
//	mux.Handle("/healthz/dedup", d.HealthHandler())
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
