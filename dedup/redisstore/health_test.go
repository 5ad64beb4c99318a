package redisstore

import (
	"strings"
	"testing"

	"github.com/dedupkit/dedupkit/dedup/driver"
)

func TestHealthFailsRedisBefore7AndWarnsOnEvictingPolicies(t *testing.T) {
	for v, st := range map[string]driver.HealthStatus{
		"6.0.16": driver.HealthFail, "6.2.14": driver.HealthFail, "5.0.7": driver.HealthFail, "7.0.0": driver.HealthOK,
		"7.0.15": driver.HealthOK, "7.2.4": driver.HealthOK, "8.0.2": driver.HealthOK, "10.1.0": driver.HealthOK, "x": driver.HealthUnknown, "7": driver.HealthUnknown,
	} {
		if c := versionCheck("s", v); c.Status != st {
			t.Errorf("version %s: %s, want %s", v, c.Status, st)
		} else if st == driver.HealthFail && !strings.Contains(c.Detail, "NX and GET") {
			t.Errorf("version %s: detail %q does not say why", v, c.Detail)
		}
	}
	for p, st := range map[string]driver.HealthStatus{
		"noeviction": driver.HealthOK, "allkeys-lru": driver.HealthWarn, "allkeys-lfu": driver.HealthWarn, "allkeys-random": driver.HealthWarn,
		"volatile-lru": driver.HealthWarn, "volatile-lfu": driver.HealthWarn, "volatile-random": driver.HealthWarn, "volatile-ttl": driver.HealthWarn,
		"": driver.HealthUnknown, "other": driver.HealthUnknown,
	} {
		if c := policyCheck("s", p); c.Status != st {
			t.Errorf("policy %q: %s, want %s", p, c.Status, st)
		}
	}
	for _, c := range []struct {
		used, max string
		want      driver.HealthStatus
	}{{"100", "0", driver.HealthOK}, {"100", "1000", driver.HealthOK}, {"899", "1000", driver.HealthOK}, {"900", "1000", driver.HealthWarn}, {"1200", "1000", driver.HealthWarn}, {"", "1000", driver.HealthUnknown}} {
		if got := memoryCheck("s", map[string]string{"used_memory": c.used, "maxmemory": c.max}); got.Status != c.want {
			t.Errorf("memory %s/%s: %s, want %s", c.used, c.max, got.Status, c.want)
		}
	}
	info := "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n\r\n# Memory\r\nused_memory:1000\r\nmaxmemory_policy:noeviction\r\n"
	if f := parseInfo(info); f["redis_version"] != "7.0.15" || f["maxmemory_policy"] != "noeviction" || f["used_memory"] != "1000" {
		t.Fatalf("parseInfo: %v", f)
	}
}
