package dedup

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"time"
)

// HealthStatus is the verdict of one health check, or of a whole report.
type HealthStatus string

const (
	// HealthOK: nothing to report.
	HealthOK HealthStatus = "ok"
	// HealthUnknown: the check could not be made, typically because a least-privilege
	// ACL user may not run INFO or CONFIG GET. It does not degrade a report.
	HealthUnknown HealthStatus = "unknown"
	// HealthWarn: the store serves, but a setting or its fill puts records at risk
	// (an evicting maxmemory-policy, memory nearly full). Alert on it; the HTTP
	// handler still answers 200.
	HealthWarn HealthStatus = "warn"
	// HealthFail: the store cannot serve this Deduper (unreachable, a Redis too old
	// for its commands) or the Deduper is closed. The HTTP handler answers 503.
	HealthFail HealthStatus = "fail"
)

// Names of the checks in a HealthReport.
const (
	// CheckDeduper fails once the Deduper is closed.
	CheckDeduper = "deduper"
	// CheckStoreReachable says whether the store answers, and how fast (Latency).
	CheckStoreReachable = "store.reachable"
	// CheckRedisVersion fails for a Redis older than 7.0 (see RedisStore.CheckHealth).
	CheckRedisVersion = "redis.version"
	// CheckRedisEviction warns of an evicting maxmemory-policy.
	CheckRedisEviction = "redis.maxmemory_policy"
	// CheckRedisMemory warns when used memory is at 90% of maxmemory or more.
	CheckRedisMemory = "redis.memory"
	// CheckForgetNotices warns while the Deduper's subscription to forget notices is
	// silent or not confirmed, so that its local tiers are being dropped every
	// WithForgetBound/4 (see Handler.Forget). Only a Deduper with a subscription (a
	// handler with a local tier on RedisStore or MemoryStore) reports it.
	CheckForgetNotices = "forget.notices"
)

// HealthCheck is one finding of a health check.
type HealthCheck struct {
	// Name says what was checked (CheckStoreReachable, CheckRedisVersion, ...).
	Name string `json:"name"`
	// Server is the server checked (host:port), empty when the check is not about one.
	Server string `json:"server,omitempty"`
	// Status is the verdict.
	Status HealthStatus `json:"status"`
	// Value is what was found: a version, a policy, "used/max" bytes.
	Value string `json:"value,omitempty"`
	// Detail says why, for a person.
	Detail string `json:"detail,omitempty"`
	// Latency is the round trip of a reachability probe (CheckStoreReachable).
	Latency time.Duration `json:"-"`
}

// MarshalJSON adds latency_seconds (the Latency, when there is one) to the fields.
func (c HealthCheck) MarshalJSON() ([]byte, error) {
	type plain HealthCheck
	var lat *float64
	if c.Latency > 0 {
		s := c.Latency.Seconds()
		lat = &s
	}
	return json.Marshal(struct {
		plain
		LatencySeconds *float64 `json:"latency_seconds,omitempty"`
	}{plain(c), lat})
}

// UnmarshalJSON reads what MarshalJSON writes, latency_seconds into Latency.
func (c *HealthCheck) UnmarshalJSON(b []byte) error {
	type plain HealthCheck
	var v struct {
		plain
		LatencySeconds float64 `json:"latency_seconds"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*c = HealthCheck(v.plain)
	c.Latency = time.Duration(v.LatencySeconds * float64(time.Second))
	return nil
}

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
	Status HealthStatus `json:"status"`
	// Checks are the findings: the Deduper's own, then the store's.
	Checks []HealthCheck `json:"checks"`
	// Local is every handler's local tier, by handler name. A full tier is normal (it
	// evicts the least recently used keys); Len well below Cap for long means the
	// tier is larger than needed.
	Local []LocalTierHealth `json:"local"`
}

// HealthChecker is implemented by a Store that can report on its own health:
// RedisStore and MemoryStore do. CheckHealth must return within ctx's deadline and
// never panic; a check it cannot make is HealthUnknown, not HealthFail.
type HealthChecker interface {
	CheckHealth(ctx context.Context) []HealthCheck
}

var (
	_ HealthChecker = (*RedisStore)(nil)
	_ HealthChecker = (*MemoryStore)(nil)
)

// DefaultHealthTimeout bounds one request to HealthHandler.
const DefaultHealthTimeout = 2 * time.Second

// Health checks the Deduper and its store: whether the Deduper is closed, the store's
// own checks (when it implements HealthChecker; otherwise CheckStoreReachable is
// HealthUnknown) and the fill of every local tier. It makes no call on the data path
// and writes nothing. ctx bounds the store's checks.
func (d *Deduper) Health(ctx context.Context) HealthReport {
	var rep HealthReport
	if d == nil || d.handlers == nil {
		return HealthReport{Status: HealthFail, Checks: []HealthCheck{{Name: CheckDeduper, Status: HealthFail, Detail: "nil *Deduper (did New fail?)"}}}
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
		rep.Checks = append(rep.Checks, HealthCheck{Name: CheckDeduper, Status: HealthFail, Detail: "the Deduper is closed"})
	}
	if hc, ok := d.base.(HealthChecker); ok {
		rep.Checks = append(rep.Checks, d.storeHealth(ctx, hc)...)
	} else {
		rep.Checks = append(rep.Checks, HealthCheck{Name: CheckStoreReachable, Status: HealthUnknown,
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
func (d *Deduper) storeHealth(ctx context.Context, hc HealthChecker) []HealthCheck {
	wait := ctx
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		wait, cancel = context.WithDeadline(context.WithoutCancel(ctx), dl.Add(healthGrace))
		defer cancel()
	}
	checks, err := detached(&guard{d: d, detach: detaches(d.base)}, waitBounded(ctx, wait), "health", false, func(ctx context.Context) ([]HealthCheck, error) {
		return hc.CheckHealth(ctx), nil
	}, nil)
	if err != nil {
		return []HealthCheck{{Name: CheckStoreReachable, Status: HealthFail, Detail: err.Error()}}
	}
	return checks
}

// healthGrace is how long after its deadline Health waits for a store's own checks.
const healthGrace = 50 * time.Millisecond

func worst(cs []HealthCheck) HealthStatus {
	s := HealthOK
	for _, c := range cs {
		switch c.Status {
		case HealthFail:
			return HealthFail
		case HealthWarn:
			s = HealthWarn
		}
	}
	return s
}

// HealthHandler returns an http.Handler that runs Health, bounded by the request's
// context and DefaultHealthTimeout, and writes the HealthReport as JSON: status 200
// when the report's Status is ok or warn, 503 when it is fail. Mount it on a mux:
//
//	mux.Handle("/healthz/dedup", d.HealthHandler())
func (d *Deduper) HealthHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), DefaultHealthTimeout)
		defer cancel()
		rep := d.Health(ctx)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		code := http.StatusOK
		if rep.Status == HealthFail {
			code = http.StatusServiceUnavailable
		}
		w.WriteHeader(code)
		if r.Method != http.MethodHead {
			_ = json.NewEncoder(w).Encode(rep)
		}
	})
}

// CheckHealth implements HealthChecker: a memory store is always reachable; the
// detail says how many records it holds of its limit.
func (s *MemoryStore) CheckHealth(context.Context) []HealthCheck {
	return []HealthCheck{{Name: CheckStoreReachable, Status: HealthOK, Value: "memory",
		Detail: fmt.Sprintf("in process: %d of %d records", s.Len(), s.limit)}}
}
