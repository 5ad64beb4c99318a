package dedup

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
)

// Failures of the connection under a redisstore.Store, through go-redis. They were the
// fault tests of the store's own RESP2 connections (WithDirectConnections, removed
// in issue 27), carried over to the one client left: each is a way a connection
// fails that a store must survive or report.

// fakeServer runs handle for every accepted connection, with its index.
func fakeServer(t *testing.T, handle func(i int, c net.Conn, r *bufio.Reader)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var n atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			i := int(n.Add(1)) - 1
			go func() { defer c.Close(); handle(i, c, bufio.NewReader(c)) }()
		}
	}()
	return ln.Addr().String()
}

// readRequest reads one request (an array of bulk strings) and returns its words.
func readRequest(r *bufio.Reader) ([]string, error) {
	line := func() (string, error) {
		l, err := r.ReadString('\n')
		return strings.TrimSuffix(l, "\r\n"), err
	}
	head, err := line()
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(head, "*") {
		return nil, fmt.Errorf("not a request: %q", head)
	}
	n, err := strconv.Atoi(head[1:])
	if err != nil {
		return nil, err
	}
	words := make([]string, n)
	for i := range words {
		h, err := line()
		if err != nil {
			return nil, err
		}
		size, err := strconv.Atoi(strings.TrimPrefix(h, "$"))
		if err != nil {
			return nil, err
		}
		b := make([]byte, size+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		words[i] = string(b[:size])
	}
	return words, nil
}

// fakeClient is a go-redis client of the fake server: RESP2, no HELLO or CLIENT
// SETINFO at connect, fast retries.
func fakeClient(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DisableIdentity: true,
		MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	return c
}

// A batch whose first command is answered LOADING (a server loading its data after
// a restart) and whose connection then breaks before the second reply is sent again
// whole: both entries are answered by the retry, neither keeps LOADING nor the break.
func TestRedisStoreRetriesLoadingThenBrokenConnection(t *testing.T) {
	var sets atomic.Int64
	addr := fakeServer(t, func(i int, c net.Conn, r *bufio.Reader) {
		for {
			req, err := readRequest(r)
			if err != nil {
				return
			}
			switch {
			case strings.EqualFold(req[0], "hello"):
				c.Write([]byte("-ERR unknown command 'HELLO'\r\n"))
				continue
			case !strings.EqualFold(req[0], "set"):
				c.Write([]byte("+OK\r\n"))
				continue
			}
			if sets.Add(1) == 1 { // the first batch: read its second SET, answer the first
				if _, err := readRequest(r); err != nil {
					return
				}
				c.Write([]byte("-LOADING Redis is loading the dataset in memory\r\n"))
				return // close before the second reply
			}
			c.Write([]byte("$-1\r\n")) // the key was free
		}
	})
	s, err := redisstore.New(fakeClient(t, addr))
	if err != nil {
		t.Fatal(err)
	}
	out, err := s.Mark(context.Background(), []driver.Entry{{Key: "dk-faults:h:a", Token: "T", TTL: time.Minute}, {Key: "dk-faults:h:b", Token: "T", TTL: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range out {
		if a.Err != nil || a.Status != driver.StatusAcquired {
			t.Errorf("entry %d: %+v, want Acquired from the retry", i, a)
		}
	}
	if n := sets.Load(); n < 3 {
		t.Errorf("%d SETs reached the server, want the batch sent twice", n)
	}
}

// A server at its client limit says so and closes the connection: the call is
// retried on a new one, as for any broken connection.
func TestRedisStoreRetriesMaxClients(t *testing.T) {
	addr := fakeServer(t, func(i int, c net.Conn, r *bufio.Reader) {
		if i == 0 {
			c.Write([]byte("-ERR max number of clients reached\r\n"))
			return
		}
		for {
			if _, err := readRequest(r); err != nil {
				return
			}
			c.Write([]byte("$-1\r\n"))
		}
	})
	s, err := redisstore.New(fakeClient(t, addr))
	if err != nil {
		t.Fatal(err)
	}
	a, err := mark1(context.Background(), s, "dk-faults:h:m", "T", "", time.Minute)
	if err != nil || a.Status != driver.StatusAcquired {
		t.Fatalf("mark: %+v, %v; want Acquired on the second connection", a, err)
	}
}

// A dial that times out is retried.
func TestRedisStoreRetriesDialTimeout(t *testing.T) {
	m := miniredis.RunT(t)
	var n atomic.Int64
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), MinRetryBackoff: time.Millisecond,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if n.Add(1) == 1 {
				dctx, cancel := context.WithTimeout(ctx, time.Nanosecond)
				defer cancel()
				time.Sleep(time.Millisecond)
				return (&net.Dialer{}).DialContext(dctx, network, addr)
			}
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}})
	defer c.Close()
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mark1(context.Background(), s, "dk-faults:d:1", "T", "", time.Minute); err != nil || n.Load() != 2 {
		t.Fatalf("mark: %v after %d dials; want success on the second", err, n.Load())
	}
}

// An idle connection the server has closed (its idle timeout) is not used: a call
// after the timeout succeeds even with retries off.
func TestRedisStoreDropsConnectionsTheServerClosed(t *testing.T) {
	addr := spawnRedis(t, "--timeout", "1")
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	entries := []driver.Entry{{Key: "dk-faults:h:b1", Token: "T", TTL: time.Minute}, {Key: "dk-faults:h:b2", Token: "T", TTL: time.Minute}}
	if _, err := mark1(ctx, s, "dk-faults:h:1", "T", "", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Mark(ctx, entries); err != nil { // a pipeline's connection too
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond)
	if _, err := mark1(ctx, s, "dk-faults:h:2", "T", "", time.Minute); err != nil {
		t.Fatalf("mark after the server closed the idle connection: %v", err)
	}
	for i := range entries {
		entries[i].Key += "-again"
	}
	if out, err := s.Mark(ctx, entries); err != nil || out[0].Err != nil {
		t.Fatalf("MarkMany after the server closed the idle connection: %v, %+v", err, out)
	}
}

// A server that goes away makes calls fail with ErrStoreUnavailable (fail closed);
// once it is back, the next call dials again and succeeds.
func TestRedisStoreServerRestart(t *testing.T) {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond})
	defer c.Close()
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := mark1(ctx, s, "p:h:1", "T", "", time.Minute); err != nil {
		t.Fatal(err)
	}
	m.Close()
	if _, err := mark1(ctx, s, "p:h:2", "T", "", time.Minute); !errors.Is(err, ErrStoreUnavailable) {
		t.Fatalf("mark with the server down: %v, want ErrStoreUnavailable", err)
	}
	if _, err := s.Mark(ctx, []driver.Entry{{Key: "p:h:3", Token: "T", TTL: time.Minute}}); !errors.Is(err, ErrStoreUnavailable) {
		t.Fatalf("MarkMany with the server down: %v, want ErrStoreUnavailable", err)
	}
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	if a, err := mark1(ctx, s, "p:h:4", "T", "", time.Minute); err != nil || a.Status != driver.StatusAcquired {
		t.Fatalf("mark after the restart: %+v, %v", a, err)
	}
}

// The client's user, password and DB are the store's: the records land in that DB
// alone, and a bad password is the call's error, ErrStoreUnavailable naming
// WRONGPASS.
func TestRedisStoreAuthAndDB(t *testing.T) {
	m := miniredis.RunT(t)
	m.RequireUserAuth("app", "secret")
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), Username: "app", Password: "secret", DB: 3})
	defer c.Close()
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if a, err := mark1(ctx, s, "p:h:k", "T", "", time.Minute); err != nil || a.Status != driver.StatusAcquired {
		t.Fatalf("mark: %+v, %v", a, err)
	}
	if _, err := s.Mark(ctx, []driver.Entry{{Key: "p:h:m", Token: "T", TTL: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"p:h:k", "p:h:m"} {
		if !m.DB(3).Exists(k) || m.DB(0).Exists(k) {
			t.Fatalf("%s is not in DB 3 alone", k)
		}
	}
	bad := redis.NewClient(&redis.Options{Addr: m.Addr(), Username: "app", Password: "wrong", MaxRetries: -1})
	defer bad.Close()
	bs, err := redisstore.New(bad)
	if err != nil {
		t.Fatal(err)
	}
	_, err = mark1(ctx, bs, "p:h:k2", "T", "", time.Minute)
	if !errors.Is(err, ErrStoreUnavailable) || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("mark with a bad password: %v, want ErrStoreUnavailable with WRONGPASS", err)
	}
}

// However many concurrent calls, single and batch, the store opens no more
// connections than the client allows: MaxActiveConns on its main pool, plus
// PipelinePoolSize for pipelines.
func TestRedisStoreConnectionsBounded(t *testing.T) {
	m := miniredis.RunT(t)
	const active, pipes = 2, 1
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), PoolSize: active, MaxActiveConns: active, PipelinePoolSize: pipes})
	defer c.Close()
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
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
	var failed atomic.Int64
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				if _, err := mark1(context.Background(), s, fmt.Sprintf("p:h:%d-%d", g, i), "T", "", time.Minute); err != nil {
					failed.Add(1)
				}
				if _, err := s.Mark(context.Background(), []driver.Entry{{Key: fmt.Sprintf("p:m:%d-%d", g, i), Token: "T", TTL: time.Minute}}); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-sampled
	if n := most.Load(); n < 1 || n > active+pipes {
		t.Fatalf("up to %d connections open, want 1 to %d (MaxActiveConns + PipelinePoolSize)", n, active+pipes)
	}
	if n := failed.Load(); n > 0 {
		t.Errorf("%d calls failed on a bounded pool", n)
	}
}
