package dedup

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/internal/testenv"
)

// The direct connections' conformance runs with the other stores' (storeBackends);
// their retries with the other retry tests (retryOps). These cover the rest.

func TestAppendCommand(t *testing.T) {
	b, err := appendCommand(nil, []any{"set", "k\r\n", int64(-5), 7, []byte("v")})
	if err != nil {
		t.Fatal(err)
	}
	want := "*5\r\n$3\r\nset\r\n$3\r\nk\r\n\r\n$2\r\n-5\r\n$1\r\n7\r\n$1\r\nv\r\n"
	if string(b) != want {
		t.Fatalf("got %q, want %q", b, want)
	}
	if _, err := appendCommand(nil, []any{"set", 1.5}); err == nil {
		t.Fatal("a float64 argument was accepted")
	}
}

func TestReadReply(t *testing.T) {
	for _, c := range []struct {
		in   string
		want any
	}{
		{"+OK\r\n", "OK"},
		{":-12\r\n", int64(-12)},
		{"$5\r\nab\r\nc\r\n", "ab\r\nc"},
		{"$0\r\n\r\n", ""},
		{"$-1\r\n", nil},
		{"*-1\r\n", nil},
		{"-ERR bad\r\n", replyError("ERR bad")},
		{"*3\r\n:1\r\n$-1\r\n*1\r\n+x\r\n", []any{int64(1), nil, []any{"x"}}},
	} {
		got, err := readReply(bufio.NewReader(strings.NewReader(c.in)))
		if err != nil || fmt.Sprintf("%#v", got) != fmt.Sprintf("%#v", c.want) {
			t.Errorf("%q: %#v, %v; want %#v", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{"", "+OK", "+OK\n", "?x\r\n", ":x\r\n", "$3\r\nab", "$3\r\nabcd\r\n",
		"$-2\r\n", fmt.Sprintf("$%d\r\n", maxBulk+1), "*2\r\n:1\r\n", "*x\r\n", "%1\r\n"} {
		if v, err := readReply(bufio.NewReader(strings.NewReader(in))); err == nil {
			t.Errorf("%q read as %#v, want an error", in, v)
		}
	}
}

// A reply stream is the server's, but a broken one must cost an error, not a panic
// or a huge allocation.
func FuzzReadReply(f *testing.F) {
	for _, s := range []string{"+OK\r\n", "*2\r\n$1\r\na\r\n:3\r\n", "$-1\r\n", "-ERR x\r\n", "*1\r\n*1\r\n*-1\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bufio.NewReaderSize(strings.NewReader(string(in)), 16)
		for range 4 {
			if _, err := readReply(r); err != nil {
				return
			}
		}
	})
}

// Error replies nested in an array (a script's) reach the caller as errors, as
// go-redis reads them; a StatusCmd refuses an integer.
func TestSetReply(t *testing.T) {
	cmd := redis.NewCmd(context.Background(), "evalsha")
	if err := setReply(cmd, []any{int64(1), replyError("ERR x")}); err != nil {
		t.Fatal(err)
	}
	if a, ok := cmd.Val().([]any); !ok || a[1].(error).Error() != "ERR x" {
		t.Fatalf("value %#v", cmd.Val())
	}
	st := redis.NewStatusCmd(context.Background(), "set")
	if err := setReply(st, int64(1)); err == nil {
		t.Fatal("an integer reply to a StatusCmd was accepted")
	}
	st.SetErr(replyError("LOADING x")) // a retried command's earlier error reply
	if err := setReply(st, "OK"); err != nil || st.Err() != nil || st.Val() != "OK" {
		t.Fatalf("retried reply: %q, %v", st.Val(), st.Err())
	}
}

func TestDirectConnectionsOptions(t *testing.T) {
	_, c := newMiniredis(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cc.Close()
	onConnect := redis.NewClient(&redis.Options{Addr: c.Options().Addr, OnConnect: func(context.Context, *redis.Conn) error { return nil }})
	defer onConnect.Close()
	for name, client := range map[string]redis.UniversalClient{"cluster": cc, "OnConnect": onConnect} {
		if _, err := NewRedisStore(client, WithDirectConnections()); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", name, err)
		}
	}
}

// A connection is set up from the client's options: the user's AUTH, its DB; a bad
// password is the call's error.
func TestDirectConnectionsSetUp(t *testing.T) {
	m := miniredis.RunT(t)
	m.RequireUserAuth("app", "secret")
	opts := &redis.Options{Addr: m.Addr(), Username: "app", Password: "secret", DB: 3}
	c := redis.NewClient(opts)
	defer c.Close()
	s := directStore(t, c)
	ctx := context.Background()
	if a, err := s.Mark(ctx, "p:h:k", "T", "", time.Minute); err != nil || a.Status != StatusAcquired {
		t.Fatalf("mark: %+v, %v", a, err)
	}
	if !m.DB(3).Exists("p:h:k") || m.DB(0).Exists("p:h:k") {
		t.Fatal("the record is not in DB 3 alone")
	}
	bad := redis.NewClient(&redis.Options{Addr: m.Addr(), Username: "app", Password: "wrong", MaxRetries: -1})
	defer bad.Close()
	_, err := directStore(t, bad).Mark(ctx, "p:h:k2", "T", "", time.Minute)
	if !errors.Is(err, ErrStoreUnavailable) || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("mark with a bad password: %v, want ErrStoreUnavailable with WRONGPASS", err)
	}
}

// Every operation, the batch forms and the EVAL fallback run for a user that holds
// only the README's ACL line, on a real server.
func TestDirectConnectionsACL(t *testing.T) {
	t.Parallel()
	srv := newACLServer(t)
	prefix, user := testenv.Prefix(), testenv.Prefix()
	srv.setUser(t, fmt.Sprintf(aclSetUser, user, "pw-"+user, prefix))
	c, _ := srv.user(t, user, "pw-"+user)
	if err := storeFlow(context.Background(), directStore(t, c), srv.admin, prefix); err != nil {
		t.Fatal(err)
	}
}

// Over TLS (the client's Dialer makes the TLS connection), with the name set.
func TestDirectConnectionsTLS(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t)
	addr := spawnTLSRedis(t, pki)
	c := tlsClient(t, addr, pki)
	c.Options().ClientName = "dedup-direct-test"
	s := directStore(t, c)
	if err := storeFlow(context.Background(), s, c, testenv.Prefix()); err != nil {
		t.Fatal(err)
	}
	list, err := c.ClientList(context.Background()).Result()
	named := false
	for _, l := range strings.Split(list, "\n") { // go-redis's own connections give a lib-name
		named = named || (strings.Contains(l, "name=dedup-direct-test") && !strings.Contains(l, "lib-name=go-redis"))
	}
	if err != nil || !named {
		t.Fatalf("CLIENT LIST (%v) names no direct connection:\n%s", err, list)
	}
}

// Close closes the connections, and a call after it fails (closed) without dialing.
func TestDirectConnectionsClose(t *testing.T) {
	m, c := newMiniredis(t)
	s, err := NewRedisStore(c, WithDirectConnections())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	before := m.CurrentConnectionCount()
	if _, err := s.Mark(ctx, "p:h:1", "T", "", time.Minute); err != nil {
		t.Fatal(err)
	}
	if n := m.CurrentConnectionCount(); n != before+1 {
		t.Fatalf("%d connections after a mark, want %d", n, before+1)
	}
	s.Close()
	testenv.Eventually(t, 5*time.Second, "the direct connection closed", func() bool { return m.CurrentConnectionCount() == before })
	if _, err := s.Mark(ctx, "p:h:2", "T", "", time.Minute); !errors.Is(err, ErrStoreClosed) || !errors.Is(err, ErrStoreUnavailable) {
		t.Fatalf("mark after Close: %v, want ErrStoreUnavailable wrapping ErrStoreClosed", err)
	}
	if m.CurrentConnectionCount() != before {
		t.Fatal("a call after Close dialed")
	}
}

// No more than the client's PoolSize connections are open, however many calls.
func TestDirectConnectionsBounded(t *testing.T) {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), PoolSize: 2})
	defer c.Close()
	s := directStore(t, c, WithoutAutoPipeline()) // each call a round trip of its own
	var most atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			most.Store(max(most.Load(), int64(m.CurrentConnectionCount())))
			select {
			case <-stop:
				return
			default:
				time.Sleep(50 * time.Microsecond)
			}
		}
	}()
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				if _, err := s.Mark(context.Background(), fmt.Sprintf("p:h:%d-%d", g, i), "T", "", time.Minute); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-sampled
	if n := most.Load(); n < 1 || n > 2 {
		t.Fatalf("up to %d connections open, want 1 or 2 (PoolSize)", n)
	}
}

// A server that goes away makes calls fail (fail closed); once it is back, the next
// call dials again and succeeds.
func TestDirectConnectionsServerRestart(t *testing.T) {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond})
	defer c.Close()
	s := directStore(t, c)
	ctx := context.Background()
	if _, err := s.Mark(ctx, "p:h:1", "T", "", time.Minute); err != nil {
		t.Fatal(err)
	}
	m.Close()
	if _, err := s.Mark(ctx, "p:h:2", "T", "", time.Minute); !errors.Is(err, ErrStoreUnavailable) {
		t.Fatalf("mark with the server down: %v, want ErrStoreUnavailable", err)
	}
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	if a, err := s.Mark(ctx, "p:h:3", "T", "", time.Minute); err != nil || a.Status != StatusAcquired {
		t.Fatalf("mark after the restart: %+v, %v", a, err)
	}
}
