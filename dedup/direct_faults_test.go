package dedup

import (
	"bufio"
	"context"
	"errors"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Faults of the direct connections (WithDirectConnections), found by review: each
// test fails on the code before its fix.

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

// startOrphanMark starts a Mark on a new store whose only reference is the call, held
// waiting for the store's one connection, which the test holds.
func startOrphanMark(t *testing.T, c *redis.Client, errc chan error) (*directConns, *directConn) {
	s, err := NewRedisStore(c, WithDirectConnections(), WithoutAutoPipeline())
	if err != nil {
		t.Fatal(err)
	}
	d := s.direct
	held, err := d.get(context.Background()) // PoolSize 1: the Mark below waits for it
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		_, err := s.Mark(context.Background(), "dk-direct:h:orphan", "T", "", time.Minute)
		errc <- err
	}()
	return d, held
}

// The cleanup of a dropped store does not close it under a running call.
func TestDirectCleanupWaitsForRunningCalls(t *testing.T) {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), PoolSize: 1})
	defer c.Close()
	errc := make(chan error, 1)
	d, held := startOrphanMark(t, c, errc)
	time.Sleep(100 * time.Millisecond)
	for range 5 {
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
	}
	d.put(held, false)
	err := <-errc
	if err != nil {
		t.Errorf("Mark on a store whose only reference is the running call: %v", err)
	}
}

// Close closes the connections in use too: a call stuck on a silent server (no read
// deadline) returns.
func TestDirectCloseEndsCallsInFlight(t *testing.T) {
	addr := fakeServer(t, func(i int, c net.Conn, r *bufio.Reader) {
		for {
			if _, err := readReply(r); err != nil {
				return
			}
		}
	})
	c := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: -2, PoolSize: 1})
	defer c.Close()
	s, err := NewRedisStore(c, WithDirectConnections())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.Mark(context.Background(), "dk-direct:h:x", "T", "", time.Minute)
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	s.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrStoreUnavailable) {
			t.Errorf("the call in flight returned %v, want ErrStoreUnavailable", err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("a call in flight still hangs 5s after Close")
	}
}

// A batch whose first command is answered LOADING and whose connection then breaks
// sends both commands again.
func TestDirectRetriesLoadingThenBrokenConnection(t *testing.T) {
	addr := fakeServer(t, func(i int, c net.Conn, r *bufio.Reader) {
		switch i {
		case 0:
			for range 2 {
				if _, err := readReply(r); err != nil {
					return
				}
			}
			c.Write([]byte("-LOADING Redis is loading the dataset in memory\r\n"))
			return // close before the second reply
		default:
			for {
				if _, err := readReply(r); err != nil {
					return
				}
				c.Write([]byte("$-1\r\n"))
			}
		}
	})
	c := redis.NewClient(&redis.Options{Addr: addr, MinRetryBackoff: time.Millisecond})
	defer c.Close()
	s, err := NewRedisStore(c, WithDirectConnections())
	if err != nil {
		t.Fatal(err)
	}
	out, err := s.MarkMany(context.Background(), []Entry{{Key: "dk-direct:h:a", Token: "T", TTL: time.Minute}, {Key: "dk-direct:h:b", Token: "T", TTL: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range out {
		if a.Err != nil || a.Status != StatusAcquired {
			t.Errorf("entry %d: %+v, want Acquired from the retry", i, a)
		}
	}
}

// An idle connection the server has closed (its idle timeout) is not used: a call
// after the timeout succeeds even with retries off.
func TestDirectDropsConnectionsTheServerClosed(t *testing.T) {
	addr := spawnRedis(t, "--timeout", "1")
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	s := directStore(t, c)
	ctx := context.Background()
	if _, err := s.Mark(ctx, "dk-direct:h:1", "T", "", time.Minute); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond)
	if _, err := s.Mark(ctx, "dk-direct:h:2", "T", "", time.Minute); err != nil {
		t.Fatalf("mark after the server closed the idle connection: %v", err)
	}
}

// A server at its client limit says so and closes the connection: retried, as
// go-redis does.
func TestDirectRetriesMaxClients(t *testing.T) {
	addr := fakeServer(t, func(i int, c net.Conn, r *bufio.Reader) {
		if i == 0 {
			c.Write([]byte("-ERR max number of clients reached\r\n"))
			return
		}
		for {
			if _, err := readReply(r); err != nil {
				return
			}
			c.Write([]byte("$-1\r\n"))
		}
	})
	c := redis.NewClient(&redis.Options{Addr: addr, MinRetryBackoff: time.Millisecond, Protocol: 2})
	defer c.Close()
	a, err := directStore(t, c).Mark(context.Background(), "dk-direct:h:m", "T", "", time.Minute)
	if err != nil || a.Status != StatusAcquired {
		t.Fatalf("mark: %+v, %v; want Acquired on the second connection", a, err)
	}
}

// Array lengths and depth are bounded before anything is allocated.
func TestReadReplyBoundsArrays(t *testing.T) {
	in := ""
	for range 8 {
		in += "*1048576\r\n"
	}
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	_, err := readReply(bufio.NewReader(strings.NewReader(in)))
	runtime.ReadMemStats(&b)
	if mb := (b.TotalAlloc - a.TotalAlloc) >> 20; err == nil || mb > 1 {
		t.Errorf("%d bytes of nested array headers: err %v, %d MB allocated", len(in), err, mb)
	}
	deep := strings.Repeat("*1\r\n", maxDepth+1) + ":1\r\n"
	if _, err := readReply(bufio.NewReader(strings.NewReader(deep))); err == nil {
		t.Errorf("arrays %d deep were read", maxDepth+1)
	}
}

// A dial that times out is retried, as go-redis does.
func TestDirectRetriesDialTimeout(t *testing.T) {
	m := miniredis.RunT(t)
	for _, direct := range []bool{true} {
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
		opts := []RedisOption{}
		if direct {
			opts = append(opts, WithDirectConnections())
		}
		s, _ := NewRedisStore(c, opts...)
		_, err := s.Mark(context.Background(), "dk-direct:d:"+strconv.FormatBool(direct), "T", "", time.Minute)
		if err != nil || n.Load() != 2 {
			t.Errorf("direct=%v: %v after %d dials; want success on the second", direct, err, n.Load())
		}
		s.Close()
		c.Close()
	}
}

// Close while 50 goroutines make calls: nothing hangs, and afterwards no slot, idle
// connection or server connection is left.
func TestDirectConcurrentClose(t *testing.T) {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), PoolSize: 3})
	defer c.Close()
	s, _ := NewRedisStore(c, WithDirectConnections())
	done := make(chan struct{})
	for g := range 50 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 200 {
				if i == 50 && g == 0 {
					go s.Close()
				}
				_, _ = s.Mark(context.Background(), "dk-direct:c:"+strconv.Itoa(g)+"-"+strconv.Itoa(i), "T", "", time.Minute)
				_, _ = s.MarkMany(context.Background(), []Entry{{Key: "dk-direct:cm:" + strconv.Itoa(g), Token: "T", TTL: time.Minute}})
			}
		}()
	}
	for range 50 {
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatal("hang")
		}
	}
	s.Close()
	time.Sleep(100 * time.Millisecond)
	if len(s.direct.slots) != 0 || len(s.direct.idle) != 0 || m.CurrentConnectionCount() > 2 {
		t.Fatalf("slots %d idle %d conns %d", len(s.direct.slots), len(s.direct.idle), m.CurrentConnectionCount())
	}
}
