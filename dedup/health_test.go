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

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
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
func find(t *testing.T, rep HealthReport, name, server string) driver.HealthCheck {
	t.Helper()
	for _, c := range rep.Checks {
		if c.Name == name && (server == "*" || c.Server == server) {
			return c
		}
	}
	t.Fatalf("no %s check for %q in %+v", name, server, rep.Checks)
	return driver.HealthCheck{}
}

func wantCheck(t *testing.T, c driver.HealthCheck, st driver.HealthStatus) {
	t.Helper()
	if c.Status != st {
		t.Fatalf("%s on %q: %s (%q, %s), want %s", c.Name, c.Server, c.Status, c.Value, c.Detail, st)
	}
}

// A memory store reports itself reachable; every handler's local tier is listed with
// its fill; a closed Deduper fails, and the HTTP handler answers 503.
func TestHealthReportsAMemoryStoreAndItsLocalTiers(t *testing.T) {
	mem, _ := memstore.New(memstore.WithLimit(100))
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
	if code != http.StatusOK || rep.Status != driver.HealthOK {
		t.Fatalf("%d %s", code, body)
	}
	c := find(t, rep, driver.CheckStoreReachable, "")
	wantCheck(t, c, driver.HealthOK)
	if !strings.Contains(c.Detail, "3 of 100 records") {
		t.Fatalf("detail %q", c.Detail)
	}
	wantLocal := []LocalTierHealth{{Handler: "audit"}, {Handler: "orders", Len: 3, Cap: orders.local.Cap()}}
	if fmt.Sprint(rep.Local) != fmt.Sprint(wantLocal) {
		t.Fatalf("local tiers %+v, want %+v", rep.Local, wantLocal)
	}

	d.Close()
	code, rep, body = serve(t, d)
	if code != http.StatusServiceUnavailable || rep.Status != driver.HealthFail {
		t.Fatalf("after Close: %d %s", code, body)
	}
	wantCheck(t, find(t, rep, driver.CheckDeduper, ""), driver.HealthFail)
}

// A store that does not implement HealthChecker is unknown, which does not fail the
// report.
func TestHealthOfAStoreWithoutChecksIsUnknownNotFailed(t *testing.T) {
	mem, _ := memstore.New()
	d, _ := New(&hookStore{Store: mem}, WithLogger(quiet))
	defer d.Close()
	code, rep, body := serve(t, d)
	if code != http.StatusOK || rep.Status != driver.HealthOK {
		t.Fatalf("%d %s", code, body)
	}
	wantCheck(t, find(t, rep, driver.CheckStoreReachable, ""), driver.HealthUnknown)
}

func redisDeduper(t *testing.T, c redis.UniversalClient) *Deduper {
	t.Helper()
	st, err := redisstore.New(c)
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
		want   driver.HealthStatus
	}{{"noeviction", driver.HealthOK}, {"allkeys-lru", driver.HealthWarn}, {"volatile-ttl", driver.HealthWarn}} {
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
			reach := find(t, rep, driver.CheckStoreReachable, addr)
			wantCheck(t, reach, driver.HealthOK)
			if reach.Latency <= 0 || !strings.Contains(body, `"latency_seconds":`) {
				t.Fatalf("no latency: %+v in %s", reach, body)
			}
			v := find(t, rep, driver.CheckRedisVersion, addr)
			wantCheck(t, v, driver.HealthOK)
			if info := rdb.Info(context.Background(), "server").Val(); !strings.Contains(info, "redis_version:"+v.Value+"\r\n") {
				t.Fatalf("version %q, INFO says %q", v.Value, info)
			}
			p := find(t, rep, driver.CheckRedisEviction, addr)
			wantCheck(t, p, c.want)
			if p.Value != c.policy {
				t.Fatalf("policy %q, want %q", p.Value, c.policy)
			}
			m := find(t, rep, driver.CheckRedisMemory, addr)
			wantCheck(t, m, driver.HealthOK)
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
	if code != http.StatusOK || rep.Status != driver.HealthOK {
		t.Fatalf("%d %s", code, body)
	}
	t.Log(body)
	reach := find(t, rep, driver.CheckStoreReachable, srv.addr)
	wantCheck(t, reach, driver.HealthOK)
	if reach.Value != "PONG" { // the ACL line allows PING, for the forget notices' subscription
		t.Fatalf("PING as the ACL user: %+v (the ACL line refuses PING?)", reach)
	}
	wantCheck(t, find(t, rep, driver.CheckRedisVersion, srv.addr), driver.HealthOK)
	for _, name := range []string{driver.CheckRedisEviction, driver.CheckRedisMemory} {
		c := find(t, rep, name, srv.addr)
		wantCheck(t, c, driver.HealthUnknown)
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
	if reach := find(t, rep, driver.CheckStoreReachable, srv.addr); code != http.StatusOK || reach.Status != driver.HealthOK || reach.Value != "NOPERM" {
		t.Fatalf("PING refused: %d %s", code, body)
	}
	bad := redis.NewClient(&redis.Options{Addr: srv.addr, Username: user, Password: "wrong", MaxRetries: -1})
	t.Cleanup(func() { bad.Close() })
	code, rep, body = serve(t, redisDeduper(t, bad))
	if code != http.StatusServiceUnavailable || rep.Status != driver.HealthFail {
		t.Fatalf("wrong password: %d %s", code, body)
	}
	wantCheck(t, find(t, rep, driver.CheckStoreReachable, srv.addr), driver.HealthFail)
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
	wantCheck(t, find(t, rep, driver.CheckStoreReachable, addr), driver.HealthFail)

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
	if rep.Status != driver.HealthFail {
		t.Fatalf("stalled server: %+v", rep)
	}
	c := find(t, rep, driver.CheckStoreReachable, l.Addr().String())
	wantCheck(t, c, driver.HealthFail)
	if !strings.Contains(c.Detail, "deadline") {
		t.Fatalf("detail %q", c.Detail)
	}
}

// On Redis Cluster every master is checked.
func TestHealthChecksEveryClusterMaster(t *testing.T) {
	t.Parallel()
	c := testenv.Cluster(t, testenv.Prefix())
	d := redisDeduper(t, c)
	code, rep, body := serve(t, d)
	if code != http.StatusOK || rep.Status == driver.HealthFail {
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
		wantCheck(t, find(t, rep, driver.CheckStoreReachable, m), driver.HealthOK)
		wantCheck(t, find(t, rep, driver.CheckRedisVersion, m), driver.HealthOK)
		find(t, rep, driver.CheckRedisEviction, m)
	}
}

// On miniredis (no INFO fields, no CONFIG) nothing fails.
func TestHealthOnMiniredisFailsNothing(t *testing.T) {
	_, c := testenv.Miniredis(t)
	code, rep, body := serve(t, redisDeduper(t, c))
	if code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	t.Log(body)
	wantCheck(t, find(t, rep, driver.CheckStoreReachable, "*"), driver.HealthOK)
}
