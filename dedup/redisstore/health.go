package redisstore

import (
	"bufio"
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/driver"
)

// memoryWarnFill is the fill of maxmemory from which CheckRedisMemory warns.
const memoryWarnFill = 0.9

// CheckHealth implements driver.HealthChecker on each server (every master of a
// cluster, shard of a ring): CheckStoreReachable (PING), CheckRedisVersion (7.0 or
// later), CheckRedisEviction (noeviction, else a warning) and CheckRedisMemory (a
// warning from 90% of maxmemory). A check the ACL forbids is HealthUnknown. It returns
// by ctx's deadline: a server that has not answered fails CheckStoreReachable.
func (s *Store) CheckHealth(ctx context.Context) []driver.HealthCheck {
	r := &nodeChecks{pending: make(map[string]bool)}
	each := func(ctx context.Context, c *redis.Client) error {
		addr := c.Options().Addr
		r.start(addr)
		r.finish(addr, redisNodeHealth(ctx, c, addr))
		return nil
	}
	done := make(chan error, 1)
	go func() {
		switch c := s.c.(type) {
		case *redis.ClusterClient:
			done <- c.ForEachMaster(ctx, each)
		case *redis.Ring:
			done <- c.ForEachShard(ctx, each)
		case *redis.Client:
			done <- each(ctx, c)
		default:
			r.start("")
			r.finish("", redisNodeHealth(ctx, s.c, ""))
			done <- nil
		}
	}()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		err = fmt.Errorf("no answer: %w", context.Cause(ctx))
	}
	return r.result(err)
}

// nodeChecks gathers the checks of servers probed concurrently.
type nodeChecks struct {
	mu      sync.Mutex
	pending map[string]bool // servers whose probe has not ended
	started bool
	checks  []driver.HealthCheck
}

func (r *nodeChecks) start(addr string) {
	r.mu.Lock()
	r.started = true
	r.pending[addr] = true
	r.mu.Unlock()
}

func (r *nodeChecks) finish(addr string, cs []driver.HealthCheck) {
	r.mu.Lock()
	delete(r.pending, addr)
	r.checks = append(r.checks, cs...)
	r.mu.Unlock()
}

// result is what has been found so far; err is why the probes stopped, if they did.
func (r *nodeChecks) result(err error) []driver.HealthCheck {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := append([]driver.HealthCheck(nil), r.checks...)
	for addr := range r.pending {
		out = append(out, driver.HealthCheck{Name: driver.CheckStoreReachable, Server: addr, Status: driver.HealthFail, Detail: fmt.Sprint(err)})
	}
	if err != nil && !r.started { // no server was even found (a cluster's slots did not load)
		out = append(out, driver.HealthCheck{Name: driver.CheckStoreReachable, Status: driver.HealthFail, Detail: err.Error()})
	}
	order := map[string]int{driver.CheckStoreReachable: 0, driver.CheckRedisVersion: 1, driver.CheckRedisEviction: 2, driver.CheckRedisMemory: 3}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Server != out[j].Server {
			return out[i].Server < out[j].Server
		}
		return order[out[i].Name] < order[out[j].Name]
	})
	return out
}

// redisNodeHealth checks one server (see Store.CheckHealth).
func redisNodeHealth(ctx context.Context, c redis.UniversalClient, server string) []driver.HealthCheck {
	start := time.Now()
	err := c.Ping(ctx).Err()
	reach := driver.HealthCheck{Name: driver.CheckStoreReachable, Server: server, Status: driver.HealthOK, Value: "PONG", Latency: time.Since(start)}
	switch {
	case err == nil:
	case isNoPermission(err):
		reach.Value, reach.Detail = "NOPERM", "PING is refused by the ACL; the server answered"
	default:
		reach.Status, reach.Value, reach.Detail = driver.HealthFail, "", err.Error()
		return []driver.HealthCheck{reach}
	}

	info, infoErr := c.Info(ctx).Result()
	fields := map[string]string{}
	if infoErr == nil {
		fields = parseInfo(info)
	}
	why := func(what string, err error) string {
		switch {
		case err == nil:
			return what + " does not say"
		case isNoPermission(err):
			return what + " is refused by the ACL"
		}
		return fmt.Sprintf("%s failed: %v", what, err)
	}

	version := driver.HealthCheck{Name: driver.CheckRedisVersion, Server: server}
	v, ok := fields["redis_version"]
	if !ok {
		var herr error
		if v, herr = helloVersion(ctx, c); herr != nil {
			version.Detail = why("INFO", infoErr) + "; " + why("HELLO", herr)
		}
	}
	if v != "" {
		version = versionCheck(server, v)
	} else {
		version.Status = driver.HealthUnknown
	}

	eviction := driver.HealthCheck{Name: driver.CheckRedisEviction, Server: server}
	policy, ok := fields["maxmemory_policy"]
	if !ok {
		m, cerr := c.ConfigGet(ctx, "maxmemory-policy").Result()
		if policy = m["maxmemory-policy"]; cerr != nil || policy == "" {
			if cerr == nil {
				cerr = fmt.Errorf("no maxmemory-policy in the reply")
			}
			eviction.Detail = why("INFO", infoErr) + "; " + why("CONFIG GET", cerr)
		}
	}
	if policy != "" {
		eviction = policyCheck(server, policy)
	} else {
		eviction.Status = driver.HealthUnknown
	}

	memory := driver.HealthCheck{Name: driver.CheckRedisMemory, Server: server, Status: driver.HealthUnknown}
	if infoErr != nil {
		memory.Detail = why("INFO", infoErr)
	} else {
		memory = memoryCheck(server, fields)
	}
	return []driver.HealthCheck{reach, version, eviction, memory}
}

func isNoPermission(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOPERM")
}

// parseInfo reads INFO's "field:value" lines.
func parseInfo(info string) map[string]string {
	out := make(map[string]string)
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = v
		}
	}
	return out
}

// helloVersion reads the version from HELLO without arguments (the protocol stays).
func helloVersion(ctx context.Context, c redis.UniversalClient) (string, error) {
	v, err := c.Do(ctx, "hello").Result()
	if err != nil {
		return "", err
	}
	var version any
	switch r := v.(type) {
	case map[any]any: // RESP3
		version = r["version"]
	case []any: // RESP2: field, value, ...
		for i := 0; i+1 < len(r); i += 2 {
			if r[i] == "version" {
				version = r[i+1]
			}
		}
	}
	s, ok := version.(string)
	if !ok || s == "" {
		return "", fmt.Errorf("no version in the reply %T", v)
	}
	return s, nil
}

// versionCheck judges a Redis version: 7.0 or later is needed for SET NX GET.
func versionCheck(server, v string) driver.HealthCheck {
	c := driver.HealthCheck{Name: driver.CheckRedisVersion, Server: server, Value: v}
	major, minor, ok := parseVersion(v)
	switch {
	case !ok:
		c.Status, c.Detail = driver.HealthUnknown, "unrecognised version"
	case major < 7:
		c.Status = driver.HealthFail
		c.Detail = fmt.Sprintf("Redis 7.0 or later is needed: Claim and Mark send SET with both NX and GET, which Redis %d.%d refuses", major, minor)
	default:
		c.Status = driver.HealthOK
	}
	return c
}

func parseVersion(v string) (major, minor int, ok bool) {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	return major, minor, err1 == nil && err2 == nil
}

// policyCheck judges a maxmemory-policy: only noeviction keeps every record.
func policyCheck(server, policy string) driver.HealthCheck {
	c := driver.HealthCheck{Name: driver.CheckRedisEviction, Server: server, Value: policy}
	switch {
	case policy == "noeviction":
		c.Status = driver.HealthOK
	case strings.HasPrefix(policy, "allkeys-"), strings.HasPrefix(policy, "volatile-"):
		c.Status = driver.HealthWarn
		c.Detail = "an evicting policy: at maxmemory Redis deletes records (all have a TTL), and each deleted record can let one duplicate through; use noeviction"
	default:
		c.Status, c.Detail = driver.HealthUnknown, "unrecognised policy"
	}
	return c
}

// memoryCheck judges used_memory against maxmemory (0: no limit).
func memoryCheck(server string, fields map[string]string) driver.HealthCheck {
	c := driver.HealthCheck{Name: driver.CheckRedisMemory, Server: server}
	used, err1 := strconv.ParseInt(fields["used_memory"], 10, 64)
	limit, err2 := strconv.ParseInt(fields["maxmemory"], 10, 64)
	switch {
	case err1 != nil || err2 != nil:
		c.Status, c.Detail = driver.HealthUnknown, "no used_memory or maxmemory in INFO"
	case limit == 0:
		c.Status, c.Value, c.Detail = driver.HealthOK, fmt.Sprintf("%d/0", used), "no maxmemory"
	default:
		c.Value = fmt.Sprintf("%d/%d", used, limit)
		c.Status = driver.HealthOK
		if float64(used) >= memoryWarnFill*float64(limit) {
			c.Status = driver.HealthWarn
			c.Detail = fmt.Sprintf("used memory is %.0f%% of maxmemory: at the limit, writes fail (noeviction: StoreUnavailable) or records are evicted", 100*float64(used)/float64(limit))
		}
	}
	return c
}
