package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/embedded"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// bin is the dedupctl binary, built once by TestMain; the tests run it as a process.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dedupctl-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "dedupctl")
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building dedupctl: %v\n%s", err, out)
		os.Exit(1)
	}
	testenv.Main(m, func() { os.RemoveAll(dir) })
}

// result is one run of the binary.
type result struct {
	code           int
	stdout, stderr string
}

func dedupctl(t *testing.T, args ...string) result {
	t.Helper()
	return dedupctlEnv(t, nil, args...)
}

// dedupctlEnv runs the binary with env added to the test's environment, less any
// REDISCLI_AUTH of its own.
func dedupctlEnv(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "REDISCLI_AUTH=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("dedupctl %q: %v", args, err)
	}
	t.Logf("dedupctl %s → %d\nstdout:\n%sstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	return r
}

func (r result) want(t *testing.T, code int, stdout, stderr string) {
	t.Helper()
	if r.code != code || !strings.Contains(r.stdout, stdout) || !strings.Contains(r.stderr, stderr) {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q", r.code, r.stdout, r.stderr, code, stdout, stderr)
	}
}

// app is an application's Deduper (with a local tier, so subscribed to forget
// notices) on a spawned redis-server.
type app struct {
	addr, prefix string
	d            *dedup.Deduper
}

func newApp(t *testing.T) app {
	t.Helper()
	addr := testenv.SpawnRedis(t).Addr()
	return newAppOn(t, redis.NewClient(&redis.Options{Addr: addr}), addr)
}

func newAppOn(t *testing.T, c redis.UniversalClient, addr string) app {
	t.Helper()
	store, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	prefix := testenv.Prefix()
	d, err := dedup.New(store, dedup.WithPrefix(prefix), dedup.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Close()
		testenv.DeletePrefix(t, c, prefix)
		c.Close()
	})
	return app{addr: addr, prefix: prefix, d: d}
}

func (a app) handler(t *testing.T, name string, opts ...dedup.HandlerOption) *dedup.Handler {
	t.Helper()
	h, err := a.d.Register(name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func (a app) args(cmd string, more ...string) []string {
	return append([]string{cmd, "-redis", a.addr, "-prefix", a.prefix}, more...)
}

func ok(context.Context) error { return nil }

func do(t *testing.T, h *dedup.Handler, key string, want dedup.Outcome) {
	t.Helper()
	res, err := h.Do(context.Background(), key, ok)
	if res.Outcome != want {
		t.Fatalf("Do(%q): %v (%v), want %v", key, res.Outcome, err, want)
	}
}

// lookup reports a DONE record (a key stored hashed: the tool hashes it as the
// library does), an absent one (exit 3), and -json gives the same as one document;
// forget deletes the record, the application's local tier drops the key, and the key
// runs again; a second forget finds nothing (exit 3).
func TestLookupReportsRecordsAndForgetMakesTheKeyRunAgain(t *testing.T) {
	t.Parallel()
	a := newApp(t)
	orders := a.handler(t, "orders")
	key := "order 1 from ünïcode land, long enough to be hashed: " + strings.Repeat("x", 40)
	do(t, orders, key, dedup.Processed)
	do(t, orders, "order-2", dedup.Processed)

	dedupctl(t, a.args("lookup", "-handler", "orders", key)...).want(t, exitOK, "DONE under orders", "")
	r := dedupctl(t, a.args("lookup", "-handler", "orders", "-json", key, "order-9")...)
	r.want(t, exitNotFound, `"state": "done"`, "")
	var doc struct {
		Prefix, Handler string
		Records         []record
	}
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Records) != 2 || doc.Records[0].RecordKey != orders.RecordKey(key) || doc.Records[0].State != "done" ||
		doc.Records[0].TTLMillis <= 0 || doc.Records[0].Owner == "" || doc.Records[1].State != "absent" || doc.Prefix != a.prefix {
		t.Fatalf("JSON: %+v", doc)
	}
	dedupctl(t, a.args("lookup", "-handler", "orders", "order-9")...).want(t, exitNotFound, "no record under orders", "")

	dedupctl(t, a.args("forget", "-handler", "orders", key)...).want(t, exitOK, "forget notice sent to 1 subscribed process", "")
	testenv.Eventually(t, 5*time.Second, "the application's local tier drops the key", func() bool {
		res, _ := orders.Do(context.Background(), key, ok)
		return res.Outcome == dedup.Processed
	})
	do(t, orders, "order-2", dedup.Duplicate) // the other key stays
	dedupctl(t, a.args("forget", "-handler", "orders", "-json", "order-9")...).want(t, exitNotFound, `"deleted": false`, "")
}

// forget leaves a record IN PROGRESS alone (exit 4) unless -force, which forgets it
// and costs the running owner its lease: its next heartbeat fails. A run that
// succeeds before that writes DONE all the same (docs/design.md §3).
func TestForgetRefusesARecordInProgressUnlessForced(t *testing.T) {
	t.Parallel()
	a := newApp(t)
	orders := a.handler(t, "orders", dedup.WithLease(time.Minute))
	started, finish := make(chan struct{}), make(chan struct{})
	done := make(chan dedup.Result, 1)
	go func() {
		res, _ := orders.Do(context.Background(), "order-1", func(context.Context) error {
			close(started)
			<-finish
			return nil
		})
		done <- res
	}()
	<-started
	dedupctl(t, a.args("lookup", "-handler", "orders", "order-1")...).want(t, exitOK, "IN PROGRESS under orders", "")
	dedupctl(t, a.args("forget", "-handler", "orders", "order-1")...).want(t, exitRefused, "-force forgets it", "")
	dedupctl(t, a.args("forget", "-handler", "orders", "-force", "order-1")...).want(t, exitOK, "forgotten", "")
	dedupctl(t, a.args("lookup", "-handler", "orders", "order-1")...).want(t, exitNotFound, "no record under orders", "")
	close(finish) // before the owner's first heartbeat (a minute's lease)
	if res := <-done; res.Outcome != dedup.Processed {
		t.Fatalf("the owner: %v, want Processed", res.Outcome)
	}
	dedupctl(t, a.args("lookup", "-handler", "orders", "order-1")...).want(t, exitOK, "DONE under orders", "")
}

// A key holding a value dedup did not write is an answer, not an outage: lookup and
// forget say so and exit 4 (refused), and forget leaves the value alone.
func TestAValueDedupDidNotWriteIsRefusedNotAFailure(t *testing.T) {
	t.Parallel()
	a := newApp(t)
	orders := a.handler(t, "orders")
	c := redis.NewClient(&redis.Options{Addr: a.addr})
	defer c.Close()
	rk := orders.RecordKey("order-1")
	if err := c.Set(context.Background(), rk, "x", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	dedupctl(t, a.args("lookup", "-handler", "orders", "order-1")...).want(t, exitRefused, "value dedup did not write", "")
	dedupctl(t, a.args("forget", "-handler", "orders", "order-1")...).want(t, exitRefused, "value dedup did not write", "")
	if v, err := c.Get(context.Background(), rk).Result(); err != nil || v != "x" {
		t.Fatalf("the value after forget: %q, %v", v, err)
	}
}

// count gives the records per handler (all, or one), and -json the same.
func TestCountGivesTheRecordsPerHandler(t *testing.T) {
	t.Parallel()
	a := newApp(t)
	orders, audit := a.handler(t, "orders"), a.handler(t, "audit")
	for i := range 5 {
		do(t, orders, fmt.Sprint("order-", i), dedup.Processed)
	}
	for i := range 2 {
		do(t, audit, fmt.Sprint("audit-", i), dedup.Processed)
	}
	r := dedupctl(t, a.args("count")...)
	r.want(t, exitOK, "orders", "")
	for _, line := range []string{"audit 2", "orders 5", "total 7"} {
		if !strings.Contains(strings.Join(strings.Fields(r.stdout), " "), line) {
			t.Fatalf("no %q in %q", line, r.stdout)
		}
	}
	r = dedupctl(t, a.args("count", "-handler", "orders", "-json")...)
	var doc struct {
		Counts map[string]int64
		Total  int64
	}
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil || r.code != exitOK || doc.Total != 5 || len(doc.Counts) != 1 {
		t.Fatalf("JSON %+v %v", doc, err)
	}
	// a handler that runs (subscribed) but has no record yet is known: 0
	payments := a.handler(t, "payments")
	testenv.Eventually(t, 5*time.Second, "the payments handler's subscription", func() bool {
		n, err := payments.Subscribers(context.Background())
		return err == nil && n >= 1
	})
	dedupctl(t, a.args("count", "-handler", "payments")...).want(t, exitOK, "payments", "")
}

// health prints the Deduper's report (-json: the HealthReport).
func TestHealthPrintsTheDedupersReport(t *testing.T) {
	t.Parallel()
	a := newApp(t)
	dedupctl(t, a.args("health")...).want(t, exitOK, "redis.version", "")
	r := dedupctl(t, a.args("health", "-json")...)
	var rep dedup.HealthReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || r.code != exitOK || rep.Status != driver.HealthOK || len(rep.Checks) == 0 {
		t.Fatalf("JSON %+v %v", rep, err)
	}
}

// A renamed handler: -former finds (and forgets) the record under the former name.
func TestFormerFindsAndForgetsARecordUnderTheFormerName(t *testing.T) {
	t.Parallel()
	a := newApp(t)
	old := a.handler(t, "orders")
	do(t, old, "order-1", dedup.Processed)
	dedupctl(t, a.args("lookup", "-handler", "orders-v2", "-former", "orders", "order-1")...).want(t, exitOK, "DONE under orders,", "")
	dedupctl(t, a.args("forget", "-handler", "orders-v2", "-former", "orders", "order-1")...).want(t, exitOK, "forgotten", "")
	testenv.Eventually(t, 5*time.Second, "the old name's process runs it again", func() bool {
		res, _ := old.Do(context.Background(), "order-1", ok)
		return res.Outcome == dedup.Processed
	})
}

// Every error is clear and has its exit code.
func TestEveryErrorIsClearAndHasItsExitCode(t *testing.T) {
	t.Parallel()
	a := newApp(t)
	a.handler(t, "orders")
	refused := testenv.RefusedAddr(t)
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"no command", nil, exitUsage, "Usage"},
		{"unknown command", []string{"drop"}, exitUsage, `unknown command "drop"`},
		{"bad flag", a.args("lookup", "-handler", "orders", "-nope", "k"), exitUsage, "flag provided but not defined: -nope"},
		{"no server", []string{"lookup", "-handler", "orders", "k"}, exitUsage, "-redis or -redis-cluster is required"},
		{"both servers", []string{"count", "-redis", a.addr, "-redis-cluster", a.addr}, exitUsage, "exclude each other"},
		{"missing key", a.args("lookup", "-handler", "orders"), exitUsage, "missing key"},
		{"empty key", a.args("forget", "-handler", "orders", ""), exitUsage, "missing key"},
		{"missing handler", a.args("forget", "k"), exitUsage, "-handler is required"},
		{"bad handler name", a.args("lookup", "-handler", "bad name", "k"), exitUsage, `handler name "bad name"`},
		{"bad former name", a.args("lookup", "-handler", "orders", "-former", "a:b", "k"), exitUsage, "former name"},
		{"bad prefix", []string{"count", "-redis", a.addr, "-prefix", "a:b"}, exitUsage, "prefix"},
		{"unknown handler", a.args("lookup", "-handler", "ordres", "k"), exitUsage, `unknown handler "ordres"`},
		{"unknown handler (forget)", a.args("forget", "-handler", "ordres", "k"), exitUsage, `unknown handler "ordres"`},
		{"unknown handler (count)", a.args("count", "-handler", "ordres"), exitUsage, `unknown handler "ordres"`},
		{"arguments to count", a.args("count", "k"), exitUsage, "takes no arguments"},
		{"unreachable", []string{"lookup", "-redis", refused, "-handler", "orders", "k"}, exitFailed, "cannot reach Redis at " + refused},
		{"unreachable cluster", []string{"count", "-redis-cluster", refused}, exitFailed, "cannot reach Redis at " + refused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dedupctl(t, tc.args...).want(t, tc.code, "", tc.stderr)
		})
	}
	// health reports an unreachable store as its failed check, on stdout (-json too)
	dedupctl(t, "health", "-redis-cluster", refused).want(t, exitFailed, "store.reachable", "")
	dedupctl(t, "health", "-redis", refused, "-json").want(t, exitFailed, `"status": "fail"`, "")
	dedupctl(t, "help").want(t, exitOK, "Exit codes", "")
	dedupctl(t, a.args("lookup", "-h")...).want(t, exitOK, "", "-former")
}

// The same on a Redis Cluster (-redis-cluster, nodes or a URL): records spread over
// the masters.
func TestCommandsWorkOnARedisCluster(t *testing.T) {
	t.Parallel()
	addrs, stop, err := embedded.StartRedisCluster(t.TempDir(), 3)
	if errors.Is(err, exec.ErrNotFound) {
		testenv.SkipNoServer(t, "redis-server is not on PATH: no Redis Cluster to spawn")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	a := newAppOn(t, redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs}), strings.Join(addrs, ","))
	orders := a.handler(t, "orders")
	for i := range 20 {
		do(t, orders, fmt.Sprint("order-", i), dedup.Processed)
	}
	args := func(cmd string, more ...string) []string {
		return append([]string{cmd, "-redis-cluster", a.addr, "-prefix", a.prefix}, more...)
	}
	dedupctl(t, args("count")...).want(t, exitOK, "20", "")
	dedupctl(t, "count", "-redis-cluster", "redis://"+addrs[0]+"?addr="+addrs[1], "-prefix", a.prefix).want(t, exitOK, "20", "")
	dedupctl(t, args("lookup", "-handler", "orders", "order-7")...).want(t, exitOK, "DONE under orders", "")
	dedupctl(t, args("forget", "-handler", "orders", "order-7")...).want(t, exitOK, "forgotten", "")
	testenv.Eventually(t, 5*time.Second, "the key runs again", func() bool {
		res, _ := orders.Do(context.Background(), "order-7", ok)
		return res.Outcome == dedup.Processed
	})
	dedupctl(t, args("health")...).want(t, exitOK, "status: ok", "")
}

// Connecting as redis-cli does: a redis:// URL with user, password and database,
// the same as -user, -pass (or REDISCLI_AUTH) and -db, a flag over the URL's part;
// the database is the one named; a wrong password fails (exit 1) without showing it.
func TestConnectsWithAURLOrFlagsAsRedisCliDoes(t *testing.T) {
	t.Parallel()
	const pass, alicePass = "default-pw-8c1f", "alice-pw-52d7"
	addr := testenv.SpawnRedis(t, "--requirepass", pass, "--user", "alice", "on", ">"+alicePass, "~*", "&*", "+@all").Addr()
	a := newAppOn(t, redis.NewClient(&redis.Options{Addr: addr, Password: pass, DB: 3}), addr)
	do(t, a.handler(t, "orders"), "order-1", dedup.Processed)
	lookup := func(more ...string) []string {
		return append([]string{"lookup", "-prefix", a.prefix, "-handler", "orders", "order-1"}, more...)
	}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
	}{
		{"URL, password", nil, lookup("-redis", "redis://:"+pass+"@"+addr+"/3")},
		{"URL, ACL user", nil, lookup("-redis", "redis://alice:"+alicePass+"@"+addr+"/3")},
		{"URL, ?db=", nil, lookup("-redis", "redis://alice:"+alicePass+"@"+addr+"?db=3")},
		{"flags", nil, lookup("-redis", addr, "-user", "alice", "-pass", alicePass, "-db", "3")},
		{"REDISCLI_AUTH", []string{"REDISCLI_AUTH=" + alicePass}, lookup("-redis", "redis://alice@"+addr+"/3")},
		{"REDISCLI_AUTH, flags", []string{"REDISCLI_AUTH=" + pass}, lookup("-redis", addr, "-db", "3")},
		{"flags over the URL", []string{"REDISCLI_AUTH=wrong"}, lookup("-redis", "redis://bob:wrong@"+addr+"/0", "-user", "alice", "-pass", alicePass, "-db", "3")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dedupctlEnv(t, tc.env, tc.args...).want(t, exitOK, "DONE under orders", "")
		})
	}
	// database 0 has no record (exit 3; the handler is known all the same: its
	// process is subscribed, and pub/sub spans the databases)
	dedupctl(t, lookup("-redis", "redis://alice:"+alicePass+"@"+addr)...).want(t, exitNotFound, "no record under orders", "")
	dedupctl(t, "count", "-redis", addr, "-pass", pass, "-db", "3", "-prefix", a.prefix).want(t, exitOK, "orders", "")

	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"wrong password", lookup("-redis", "redis://alice:not-"+alicePass+"@"+addr+"/3"), exitFailed, "WRONGPASS"},
		{"no password", lookup("-redis", addr, "-db", "3"), exitFailed, "NOAUTH"},
		{"bad URL", lookup("-redis", "redis://alice:not-"+alicePass+"@[::1"), exitUsage, "-redis: missing ']' in host"},
		{"bad scheme", lookup("-redis", "http://alice:not-"+alicePass+"@"+addr), exitUsage, "invalid URL scheme: http"},
		{"bad database", lookup("-redis", "redis://alice:not-"+alicePass+"@"+addr+"/x"), exitUsage, "invalid database number"},
		{"negative -db", lookup("-redis", addr, "-db", "-1"), exitUsage, "-db must not be negative"},
		{"cluster database", []string{"count", "-redis-cluster", "redis://" + addr + "/3"}, exitUsage, "database 0 only"},
		{"cluster -db", []string{"count", "-redis-cluster", addr, "-db", "3"}, exitUsage, "database 0 only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := dedupctl(t, tc.args...)
			r.want(t, tc.code, "", tc.stderr)
			if strings.Contains(r.stdout+r.stderr, alicePass) {
				t.Fatal("the password shows in the output")
			}
		})
	}
}

// rediss:// (or -tls) against a redis-server that speaks only TLS and requires a
// client certificate: -cacert, -cert and -key, or -insecure; without the CA, with a
// server name the certificate does not carry (-sni), without a client certificate, or
// in plain TCP, it fails (exit 1); the TLS flags without TLS are a usage error.
func TestConnectsOverTLSWithClientCertificates(t *testing.T) {
	t.Parallel()
	const pass = "tls-pw-0e4a"
	pki := testenv.NewPKI(t)
	addr := testenv.SpawnRedis(t, append(pki.RedisTLSArgs(), "--requirepass", pass)...).Addr()
	a := newAppOn(t, redis.NewClient(&redis.Options{Addr: addr, Password: pass, DB: 2, TLSConfig: pki.ClientTLS()}), addr)
	do(t, a.handler(t, "orders"), "order-1", dedup.Processed)
	lookup := func(more ...string) []string {
		return append([]string{"lookup", "order-1", "-prefix", a.prefix, "-handler", "orders", "-timeout", "5s"}, more...)
	}
	url := "rediss://:" + pass + "@" + addr + "/2"
	mtls := []string{"-cacert", pki.CA, "-cert", pki.ClientCert, "-key", pki.ClientKey}
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"rediss://", lookup(append([]string{"-redis", url}, mtls...)...), exitOK, ""},
		{"-tls", lookup(append([]string{"-redis", addr, "-tls", "-pass", pass, "-db", "2"}, mtls...)...), exitOK, ""},
		{"-sni", lookup(append([]string{"-redis", url, "-sni", "127.0.0.1"}, mtls...)...), exitOK, ""},
		{"-insecure", lookup("-redis", url, "-insecure", "-cert", pki.ClientCert, "-key", pki.ClientKey), exitOK, ""},
		{"unknown CA", lookup("-redis", url, "-cert", pki.ClientCert, "-key", pki.ClientKey), exitFailed, "certificate signed by unknown authority"},
		{"wrong name", lookup(append([]string{"-redis", url, "-sni", "redis.example.com"}, mtls...)...), exitFailed, "wanted to match redis.example.com"},
		{"no client certificate", lookup("-redis", url, "-cacert", pki.CA), exitFailed, "cannot reach Redis at " + addr}, // "tls: certificate required", or a reset,
		{"plain TCP", lookup("-redis", "redis://:"+pass+"@"+addr+"/2"), exitFailed, "cannot reach Redis at " + addr},
		{"-cacert without TLS", lookup("-redis", addr, "-cacert", pki.CA), exitUsage, "-cacert needs -tls or a rediss:// URL"},
		{"-insecure without TLS", lookup("-redis", addr, "-insecure"), exitUsage, "-insecure needs -tls"},
		{"-cert without -key", lookup("-redis", url, "-cert", pki.ClientCert), exitUsage, "-cert and -key go together"},
		{"no CA file", lookup("-redis", url, "-cacert", pki.CA+".missing"), exitUsage, "-cacert: open"},
		{"not a CA file", lookup("-redis", url, "-cacert", pki.ClientKey), exitUsage, "-cacert: no PEM certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout := ""
			if tc.code == exitOK {
				stdout = "DONE under orders"
			}
			r := dedupctl(t, tc.args...)
			r.want(t, tc.code, stdout, tc.stderr)
			if strings.Contains(r.stdout+r.stderr, pass) {
				t.Fatal("the password shows in the output")
			}
		})
	}
}

// -timeout bounds the whole command: against a server that accepts connections and
// never answers (plain, TLS, a Cluster seed), or one that answers the connection
// handshake and then no command, every command gives up after -timeout, with exit 1
// and an error that says so.
func TestTimeoutBoundsEveryCommandAgainstASilentServer(t *testing.T) {
	t.Parallel()
	silent := testenv.SilentAddr(t)
	proxy, err := testenv.NewProxy(testenv.SpawnRedis(t).Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	proxy.Arm(testenv.Fault{Kind: testenv.Delay, Replies: 1 << 20, Hold: time.Minute})
	const timeout, slack = time.Second, time.Second
	for _, tc := range []struct {
		name           string
		args           []string
		stdout, stderr string // health reports an unreachable store as a failed check
	}{
		{"lookup", []string{"lookup", "-redis", silent, "-handler", "orders", "k"}, "", "no answer within -timeout 1s"},
		{"forget", []string{"forget", "-redis", silent, "-handler", "orders", "k"}, "", "no answer within -timeout 1s"},
		{"count", []string{"count", "-redis", silent}, "", "no answer within -timeout 1s"},
		{"health", []string{"health", "-redis", silent}, "store.reachable          fail", ""},
		{"health -json", []string{"health", "-redis", silent, "-json"}, `"status": "fail"`, ""},
		{"rediss", []string{"health", "-redis", "rediss://" + silent}, "store.reachable          fail", ""},
		{"cluster", []string{"count", "-redis-cluster", silent}, "", "no answer within -timeout 1s"},
		{"after the handshake", []string{"lookup", "-redis", proxy.Addr(), "-handler", "orders", "k"}, "", "no answer within -timeout 1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			args := append([]string{tc.args[0], "-timeout", timeout.String()}, tc.args[1:]...)
			r := dedupctl(t, args...)
			elapsed := time.Since(start)
			t.Logf("%s: %v (-timeout %v)", tc.name, elapsed, timeout)
			r.want(t, exitFailed, tc.stdout, tc.stderr)
			if elapsed > timeout+slack {
				t.Fatalf("took %v, want at most -timeout %v + %v", elapsed, timeout, slack)
			}
		})
	}
}

// Flags may follow the keys, or stand between them; after "--" everything is a key,
// and an unknown flag after a key is refused, named.
func TestFlagsMayFollowTheKeys(t *testing.T) {
	t.Parallel()
	a := newApp(t)
	do(t, a.handler(t, "orders"), "order-1", dedup.Processed)
	dedupctl(t, "lookup", "order-1", "-redis", a.addr, "-prefix", a.prefix, "-handler", "orders", "-json").
		want(t, exitOK, `"state": "done"`, "")
	r := dedupctl(t, "lookup", "-redis", a.addr, "order-1", "-handler=orders", "order-2", "-prefix", a.prefix)
	r.want(t, exitNotFound, "order-1: DONE under orders", "")
	r.want(t, exitNotFound, "order-2: no record under orders", "")
	dedupctl(t, "forget", "order-2", "-redis", a.addr, "-prefix", a.prefix, "-handler", "orders", "-json").
		want(t, exitNotFound, `"deleted": false`, "")
	dedupctl(t, "count", "-redis", a.addr, "-prefix", a.prefix, "-json").want(t, exitOK, `"total": 1`, "")
	dedupctl(t, "lookup", "-redis", a.addr, "-prefix", a.prefix, "-handler", "orders", "--", "-json", "order-1").
		want(t, exitNotFound, "-json: no record under orders", "")
	dedupctl(t, "lookup", "order-1", "-redis", a.addr, "-handler", "orders", "-nope").
		want(t, exitUsage, "", "flag provided but not defined: -nope")
	dedupctl(t, "lookup", "order-1", "-redis", a.addr, "-handler").
		want(t, exitUsage, "", "flag needs an argument: -handler")
	dedupctl(t, "forget", "order-1", "-force=false", "-redis", a.addr, "-prefix", a.prefix, "-handler", "orders").
		want(t, exitOK, "forgotten", "")
}
