package driver

import (
	"context"
	"encoding/json"
	"time"
)

// HealthStatus is the verdict of one health check, or of a whole report.
type HealthStatus string

const (
	// HealthOK: nothing to report.
	HealthOK HealthStatus = "ok"
	// HealthUnknown: the check could not be made (an ACL); it does not degrade a report.
	HealthUnknown HealthStatus = "unknown"
	// HealthWarn: the store serves, but a setting or its fill puts records at risk.
	HealthWarn HealthStatus = "warn"
	// HealthFail: the store cannot serve (unreachable, too old), or the Deduper closed.
	HealthFail HealthStatus = "fail"
)

// Names of the checks in a health report.
const (
	// CheckDeduper fails once the Deduper is closed.
	CheckDeduper = "deduper"
	// CheckForgetNotices warns while the notice subscription is silent or unconfirmed.
	CheckForgetNotices = "forget.notices"
	// CheckStoreReachable says whether the store answers, and how fast.
	CheckStoreReachable = "store.reachable"
	// CheckRedisVersion fails for a Redis older than 7.0.
	CheckRedisVersion = "redis.version"
	// CheckRedisEviction warns of an evicting maxmemory-policy.
	CheckRedisEviction = "redis.maxmemory_policy"
	// CheckRedisMemory warns when used memory is at 90% of maxmemory or more.
	CheckRedisMemory = "redis.memory"
)

// HealthCheck is one finding of a health check.
type HealthCheck struct {
	// Name says what was checked (CheckStoreReachable, ...).
	Name string `json:"name"`
	// Server is the server checked (host:port), empty when not about one.
	Server string `json:"server,omitempty"`
	// Status is the verdict.
	Status HealthStatus `json:"status"`
	// Value is what was found: a version, a policy, "used/max" bytes.
	Value string `json:"value,omitempty"`
	// Detail says why, for a person.
	Detail string `json:"detail,omitempty"`
	// Latency is the round trip of a reachability probe.
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

// Pinger is a store that can tell cheaply whether it answers: dedup's breaker probes
// it with Ping. A store without it is probed with a Release of a key no record uses.
type Pinger interface {
	Ping(ctx context.Context) error
}

// HealthChecker is a Store that reports on its own health. CheckHealth returns by
// ctx's deadline and never panics; a check it cannot make is HealthUnknown.
type HealthChecker interface {
	CheckHealth(ctx context.Context) []HealthCheck
}
