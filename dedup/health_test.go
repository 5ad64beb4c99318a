package dedup

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/internal/testenv"
)

// serve runs d's HealthHandler once and returns the status code and the decoded body.
func serve(t *testing.T, d *Deduper) (int, HealthReport, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	d.HealthHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q", ct)
	}
	var rep HealthReport
	body := rec.Body.String()
	if err := json.Unmarshal([]byte(body), &rep); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return rec.Code, rep, body
}

// find returns the check named name of server (any server when server is "*").
func find(t *testing.T, rep HealthReport, name, server string) HealthCheck {
	t.Helper()
	for _, c := range rep.Checks {
		if c.Name == name && (server == "*" || c.Server == server) {
			return c
		}
	}
	t.Fatalf("no %s check for %q in %+v", name, server, rep.Checks)
	return HealthCheck{}
}

func wantCheck(t *testing.T, c HealthCheck, st HealthStatus) {
	t.Helper()
	if c.Status != st {
		t.Fatalf("%s on %q: %s (%q, %s), want %s", c.Name, c.Server, c.Status, c.Value, c.Detail, st)
	}
}

// A memory store reports itself reachable; every handler's local tier is listed with
// its fill; a closed Deduper fails, and the HTTP handler answers 503.
func TestHealthReportsAMemoryStoreAndItsLocalTiers(t *testing.T) {
	mem, _ := NewMemoryStore(WithMemoryLimit(100))
	d, err := New(mem, WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	orders, _ := d.Register("orders", WithLocalCache(1000, 0))
	if _, err := d.Register("audit", WithLocalCache(0, 0)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c"} {
		res, err := orders.Do(ctx, k, ok)
		want(t, res, err, Processed)
	}
	code, rep, body := serve(t, d)
	if code != http.StatusOK || rep.Status != HealthOK {
		t.Fatalf("%d %s", code, body)
	}
	c := find(t, rep, CheckStoreReachable, "")
	wantCheck(t, c, HealthOK)
	if !strings.Contains(c.Detail, "3 of 100 records") {
		t.Fatalf("detail %q", c.Detail)
	}
	wantLocal := []LocalTierHealth{{Handler: "audit"}, {Handler: "orders", Len: 3, Cap: orders.local.Cap()}}
	if fmt.Sprint(rep.Local) != fmt.Sprint(wantLocal) {
		t.Fatalf("local tiers %+v, want %+v", rep.Local, wantLocal)
	}

	d.Close()
	code, rep, body = serve(t, d)
	if code != http.StatusServiceUnavailable || rep.Status != HealthFail {
		t.Fatalf("after Close: %d %s", code, body)
	}
	wantCheck(t, find(t, rep, CheckDeduper, ""), HealthFail)
}

// A store that does not implement HealthChecker is unknown, which does not fail the
// report.
func TestHealthOfAStoreWithoutChecksIsUnknownNotFailed(t *testing.T) {
	mem, _ := NewMemoryStore()
	d, _ := New(&hookStore{Store: mem}, WithLogger(quiet))
	defer d.Close()
	code, rep, body := serve(t, d)
	if code != http.StatusOK || rep.Status != HealthOK {
		t.Fatalf("%d %s", code, body)
	}
	wantCheck(t, find(t, rep, CheckStoreReachable, ""), HealthUnknown)
}

func redisDeduper(t *testing.T, c redis.UniversalClient) *Deduper {
	t.Helper()
	st, err := NewRedisStore(c)
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(st, WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// On a real redis-server: reachable with a latency, the version, the policy (an
// evicting one warns, and the handler still answers 200) and the memory.
func TestHealthReportsRedisVersionPolicyAndMemory(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		policy string
		want   HealthStatus
	}{{"noeviction", HealthOK}, {"allkeys-lru", HealthWarn}, {"volatile-ttl", HealthWarn}} {
		t.Run(c.policy, func(t *testing.T) {
			t.Parallel()
			addr := spawnRedis(t, "--maxmemory", "1gb", "--maxmemory-policy", c.policy)
			rdb := redis.NewClient(&redis.Options{Addr: addr})
			t.Cleanup(func() { rdb.Close() })
			d := redisDeduper(t, rdb)
			code, rep, body := serve(t, d)
			if code != http.StatusOK || rep.Status != c.want {
				t.Fatalf("%d %s", code, body)
			}
			reach := find(t, rep, CheckStoreReachable, addr)
			wantCheck(t, reach, HealthOK)
			if reach.Latency <= 0 || !strings.Contains(body, `"latency_seconds":`) {
				t.Fatalf("no latency: %+v in %s", reach, body)
			}
			v := find(t, rep, CheckRedisVersion, addr)
			wantCheck(t, v, HealthOK)
			if info := rdb.Info(context.Background(), "server").Val(); !strings.Contains(info, "redis_version:"+v.Value+"\r\n") {
				t.Fatalf("version %q, INFO says %q", v.Value, info)
			}
			p := find(t, rep, CheckRedisEviction, addr)
			wantCheck(t, p, c.want)
			if p.Value != c.policy {
				t.Fatalf("policy %q, want %q", p.Value, c.policy)
			}
			m := find(t, rep, CheckRedisMemory, addr)
			wantCheck(t, m, HealthOK)
			if !strings.HasSuffix(m.Value, fmt.Sprintf("/%d", 1<<30)) {
				t.Fatalf("memory %q, want used/%d", m.Value, 1<<30)
			}
		})
	}
}

// As the README's least-privilege ACL user, INFO and CONFIG GET are refused: the
// policy and memory checks are unknown, the version comes from HELLO, PING (allowed
// for the forget notices' subscription) proves the server reachable, and the report
// is ok (200). The ACL line is not
// widened for the health check. A wrong password fails the report (503).
func TestHealthAsTheACLUserIsOkWithoutINFO(t *testing.T) {
	t.Parallel()
	srv := newACLServer(t)
	prefix, user := testenv.Prefix(), testenv.Prefix()
	srv.setUser(t, fmt.Sprintf(aclSetUser, user, "pw", prefix))
	uc, _ := srv.user(t, user, "pw")
	d := redisDeduper(t, uc)
	code, rep, body := serve(t, d)
	if code != http.StatusOK || rep.Status != HealthOK {
		t.Fatalf("%d %s", code, body)
	}
	t.Log(body)
	reach := find(t, rep, CheckStoreReachable, srv.addr)
	wantCheck(t, reach, HealthOK)
	if reach.Value != "PONG" { // the ACL line allows PING, for the forget notices' subscription
		t.Fatalf("PING as the ACL user: %+v (the ACL line refuses PING?)", reach)
	}
	wantCheck(t, find(t, rep, CheckRedisVersion, srv.addr), HealthOK)
	for _, name := range []string{CheckRedisEviction, CheckRedisMemory} {
		c := find(t, rep, name, srv.addr)
		wantCheck(t, c, HealthUnknown)
		if !strings.Contains(c.Detail, "refused by the ACL") {
			t.Fatalf("%s: detail %q", name, c.Detail)
		}
	}
	// a user that may not PING: NOPERM proves the server up all the same
	noPing := testenv.Prefix()
	srv.setUser(t, fmt.Sprintf(aclSetUser, noPing, "pw", prefix))
	srv.setUser(t, "ACL SETUSER "+noPing+" -ping")
	npc, _ := srv.user(t, noPing, "pw")
	code, rep, body = serve(t, redisDeduper(t, npc))
	if reach := find(t, rep, CheckStoreReachable, srv.addr); code != http.StatusOK || reach.Status != HealthOK || reach.Value != "NOPERM" {
		t.Fatalf("PING refused: %d %s", code, body)
	}
	bad := redis.NewClient(&redis.Options{Addr: srv.addr, Username: user, Password: "wrong", MaxRetries: -1})
	t.Cleanup(func() { bad.Close() })
	code, rep, body = serve(t, redisDeduper(t, bad))
	if code != http.StatusServiceUnavailable || rep.Status != HealthFail {
		t.Fatalf("wrong password: %d %s", code, body)
	}
	wantCheck(t, find(t, rep, CheckStoreReachable, srv.addr), HealthFail)
}

// An unreachable server fails the report; so does one that accepts connections and
// never answers, by the context's deadline.
func TestHealthFailsForAnUnreachableOrSilentServer(t *testing.T) {
	t.Parallel()
	addr := testenv.RefusedAddr(t) // nothing listens there, and nothing can start to
	down := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { down.Close() })
	code, rep, body := serve(t, redisDeduper(t, down))
	if code != http.StatusServiceUnavailable {
		t.Fatalf("%d %s", code, body)
	}
	wantCheck(t, find(t, rep, CheckStoreReachable, addr), HealthFail)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conns := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(conns)
				return
			}
			conns <- c // held open, never answered
		}
	}()
	t.Cleanup(func() {
		l.Close()
		for c := range conns {
			c.Close()
		}
	})
	stalled := redis.NewClient(&redis.Options{Addr: l.Addr().String(), MaxRetries: -1, ReadTimeout: time.Minute})
	t.Cleanup(func() { stalled.Close() })
	d := redisDeduper(t, stalled)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	rep = d.Health(ctx)
	if rep.Status != HealthFail {
		t.Fatalf("stalled server: %+v", rep)
	}
	c := find(t, rep, CheckStoreReachable, l.Addr().String())
	wantCheck(t, c, HealthFail)
	if !strings.Contains(c.Detail, "deadline") {
		t.Fatalf("detail %q", c.Detail)
	}
}

// On Redis Cluster every master is checked.
func TestHealthChecksEveryClusterMaster(t *testing.T) {
	t.Parallel()
	c := clusterRedis(t, testenv.Prefix())
	d := redisDeduper(t, c)
	code, rep, body := serve(t, d)
	if code != http.StatusOK || rep.Status == HealthFail {
		t.Fatalf("%d %s", code, body)
	}
	var mu sync.Mutex
	var masters []string
	if err := c.ForEachMaster(context.Background(), func(_ context.Context, m *redis.Client) error {
		mu.Lock()
		masters = append(masters, m.Options().Addr)
		mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(masters) < 3 {
		t.Fatalf("%d masters", len(masters))
	}
	for _, m := range masters {
		wantCheck(t, find(t, rep, CheckStoreReachable, m), HealthOK)
		wantCheck(t, find(t, rep, CheckRedisVersion, m), HealthOK)
		find(t, rep, CheckRedisEviction, m)
	}
}

// On miniredis (no INFO fields, no CONFIG) nothing fails.
func TestHealthOnMiniredisFailsNothing(t *testing.T) {
	_, c := newMiniredis(t)
	code, rep, body := serve(t, redisDeduper(t, c))
	if code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	t.Log(body)
	wantCheck(t, find(t, rep, CheckStoreReachable, "*"), HealthOK)
}

func TestHealthFailsRedisBefore7AndWarnsOnEvictingPolicies(t *testing.T) {
	for v, st := range map[string]HealthStatus{
		"6.0.16": HealthFail, "6.2.14": HealthFail, "5.0.7": HealthFail, "7.0.0": HealthOK,
		"7.0.15": HealthOK, "7.2.4": HealthOK, "8.0.2": HealthOK, "10.1.0": HealthOK, "x": HealthUnknown, "7": HealthUnknown,
	} {
		if c := versionCheck("s", v); c.Status != st {
			t.Errorf("version %s: %s, want %s", v, c.Status, st)
		} else if st == HealthFail && !strings.Contains(c.Detail, "NX and GET") {
			t.Errorf("version %s: detail %q does not say why", v, c.Detail)
		}
	}
	for p, st := range map[string]HealthStatus{
		"noeviction": HealthOK, "allkeys-lru": HealthWarn, "allkeys-lfu": HealthWarn, "allkeys-random": HealthWarn,
		"volatile-lru": HealthWarn, "volatile-lfu": HealthWarn, "volatile-random": HealthWarn, "volatile-ttl": HealthWarn,
		"": HealthUnknown, "other": HealthUnknown,
	} {
		if c := policyCheck("s", p); c.Status != st {
			t.Errorf("policy %q: %s, want %s", p, c.Status, st)
		}
	}
	for _, c := range []struct {
		used, max string
		want      HealthStatus
	}{{"100", "0", HealthOK}, {"100", "1000", HealthOK}, {"899", "1000", HealthOK}, {"900", "1000", HealthWarn}, {"1200", "1000", HealthWarn}, {"", "1000", HealthUnknown}} {
		if got := memoryCheck("s", map[string]string{"used_memory": c.used, "maxmemory": c.max}); got.Status != c.want {
			t.Errorf("memory %s/%s: %s, want %s", c.used, c.max, got.Status, c.want)
		}
	}
	info := "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n\r\n# Memory\r\nused_memory:1000\r\nmaxmemory_policy:noeviction\r\n"
	if f := parseInfo(info); f["redis_version"] != "7.0.15" || f["maxmemory_policy"] != "noeviction" || f["used_memory"] != "1000" {
		t.Fatalf("parseInfo: %v", f)
	}
	if got := worst([]HealthCheck{{Status: HealthOK}, {Status: HealthUnknown}}); got != HealthOK {
		t.Fatalf("ok+unknown: %s", got)
	}
	if got := worst([]HealthCheck{{Status: HealthWarn}, {Status: HealthUnknown}}); got != HealthWarn {
		t.Fatalf("warn+unknown: %s", got)
	}
	if got := worst([]HealthCheck{{Status: HealthWarn}, {Status: HealthFail}, {Status: HealthOK}}); got != HealthFail {
		t.Fatalf("warn+fail: %s", got)
	}
}
