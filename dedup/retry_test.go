package dedup

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// These tests prove docs/design.md §3 "Why owner tokens": a Claim or Mark whose first attempt landed
// on the server but whose reply was lost, and which go-redis then retried on its own,
// is recognised as the caller's own and never as a duplicate. Each runs a naive
// SETNX-based claim under the same conditions as a control, so it is known to bite.

const retryTrials = 100

// retryOp is one way to claim a fresh key: ours (Claim, Mark) or the naive SETNX.
type retryOp struct {
	name string
	// run claims key for token and reports whether the caller may go ahead: false
	// (or an error) is a false duplicate, since no one else ever touches the key.
	run func(ctx context.Context, c *redis.Client, key, token string) (own bool, err error)
	// recordPrefix is how the value the call must leave on the server begins.
	recordPrefix func(token string) string
	naive        bool
}

func retryOps() []retryOp {
	const ttl = 30 * time.Second
	// own runs one store call (claim or mark) and tells whether it was Acquired.
	own := func(call func(s *redisstore.Store, ctx context.Context, key, token string) (driver.Answer, error)) func(context.Context, *redis.Client, string, string) (bool, error) {
		return func(ctx context.Context, c *redis.Client, key, token string) (bool, error) {
			s, err := redisstore.New(c)
			if err != nil {
				return false, err
			}
			a, err := call(s, ctx, key, token)
			return err == nil && a.Status == driver.StatusAcquired, err
		}
	}
	claim := func(s *redisstore.Store, ctx context.Context, key, token string) (driver.Answer, error) {
		return claim1(ctx, s, key, token, "", ttl)
	}
	mark := func(s *redisstore.Store, ctx context.Context, key, token string) (driver.Answer, error) {
		return mark1(ctx, s, key, token, "", ttl)
	}
	return []retryOp{
		{name: "Claim", run: own(claim), recordPrefix: func(token string) string { return "p:" + token + ":" }},
		{name: "Mark", run: own(mark), recordPrefix: func(token string) string { return "d:" + token + ":" }},
		{name: "naive-SETNX", naive: true, run: func(ctx context.Context, c *redis.Client, key, _ string) (bool, error) {
			return c.SetNX(ctx, key, "1", ttl).Result() // false = "duplicate"
		}, recordPrefix: func(string) string { return "1" }},
	}
}

// replyDropper is shared by every connection a client dials. When armed, the next Read
// on any of them reads the reply from the server and throws it away: the command landed,
// its reply was lost. That connection then reports a read timeout on every Read, as a
// real socket whose reply never came would (go-redis's RESP3 push-notification peek
// reads before the reply does, and it only logs its error), until go-redis drops it
// and retries the command on a new connection.
type replyDropper struct {
	armed   atomic.Bool
	fired   atomic.Int64
	mu      sync.Mutex
	dropped []byte // the bytes of the last dropped reply
}

func (d *replyDropper) arm() { d.armed.Store(true) }

func (d *replyDropper) last() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return string(d.dropped)
}

func (d *replyDropper) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &dropConn{Conn: c, d: d}, nil
}

// dropConn hides its *net.TCPConn (no syscall.Conn), so go-redis never peeks at the
// socket behind our back: every byte it reads passes through Read.
type dropConn struct {
	net.Conn
	d    *replyDropper
	lost atomic.Bool // this connection's reply was dropped
}

func (c *dropConn) Read(p []byte) (int, error) {
	if c.lost.Load() {
		return 0, c.timeout()
	}
	if !c.d.armed.CompareAndSwap(true, false) {
		return c.Conn.Read(p)
	}
	n, err := c.Conn.Read(p) // wait for the reply: the command has run on the server
	if err != nil {
		return n, err // a real failure: not a dropped reply, so not counted
	}
	c.d.mu.Lock()
	c.d.dropped = append(c.d.dropped[:0], p[:n]...)
	c.d.mu.Unlock()
	c.lost.Store(true)
	c.d.fired.Add(1)
	return 0, c.timeout()
}

func (c *dropConn) timeout() error {
	return &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.ErrDeadlineExceeded}
}

// firstReplyOK reports whether a dropped reply is what op's first attempt on a fresh
// key answers: proof that the lost read was the trial's own reply. Every op's is OK:
// the SET NX PX of a Claim or a Mark on a free key, a plain SET.
func firstReplyOK(reply string) bool { return reply == "+OK\r\n" }

func TestRetriedClaimAfterALostReplyIsOwn(t *testing.T) {
	t.Run("miniredis", func(t *testing.T) {
		m, _ := testenv.Miniredis(t)
		testLostReply(t, m.Addr())
	})
	t.Run("redis-server", func(t *testing.T) {
		testLostReply(t, spawnRedis(t))
	})
}

func testLostReply(t *testing.T, addr string) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d := &replyDropper{}
	// One connection: after the warm-up the next Read on it is the trial's reply.
	// MaxRetries stays at its default (3); go-redis retries a read timeout itself.
	// A short backoff only keeps the 300 trials quick.
	c := redis.NewClient(&redis.Options{
		Addr: addr, Dialer: d.dial, PoolSize: 1,
		MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 2 * time.Millisecond,
	})
	defer c.Close()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	prefix := testenv.Prefix()
	// Load both scripts paths (EVALSHA's NOSCRIPT, then EVAL) outside the trials.
	if _, err := claim1(ctx, s, prefix+":warm:claim", "warm", "", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := mark1(ctx, s, prefix+":warm:mark", "warm", "", time.Minute); err != nil {
		t.Fatal(err)
	}

	for _, op := range retryOps() {
		var falseDup, badReply int
		var firstErr error
		before := d.fired.Load()
		for i := range retryTrials {
			key := fmt.Sprintf("%s:%s:%d", prefix, op.name, i)
			token := fmt.Sprintf("t%d", i)
			d.arm()
			own, err := op.run(ctx, c, key, token)
			if d.armed.Swap(false) {
				t.Fatalf("%s trial %d: the reply drop never fired", op.name, i)
			}
			if !own {
				falseDup++
				if err != nil && firstErr == nil {
					firstErr = err
				}
			}
			if r := d.last(); !firstReplyOK(r) {
				badReply++
				t.Logf("%s trial %d: dropped %q, not the first attempt's reply", op.name, i, r)
			}
			if v, err := c.Get(ctx, key).Result(); err != nil || !strings.HasPrefix(v, op.recordPrefix(token)) {
				t.Errorf("%s trial %d: record %q (%v), want prefix %q", op.name, i, v, err, op.recordPrefix(token))
			}
		}
		fired := d.fired.Load() - before
		t.Logf("%s: %d/%d false duplicates, %d drops fired", op.name, falseDup, retryTrials, fired)
		if fired != retryTrials {
			t.Errorf("%s: %d drops fired, want %d: the test proved nothing", op.name, fired, retryTrials)
		}
		if badReply != 0 {
			t.Errorf("%s: %d dropped reads were not the trial's first reply", op.name, badReply)
		}
		if op.naive {
			if falseDup < 90 {
				t.Errorf("naive SETNX: %d/%d false duplicates, want >= 90: the lost reply did not bite", falseDup, retryTrials)
			}
		} else if falseDup != 0 {
			t.Errorf("%s: %d/%d retried calls were taken for duplicates (first error: %v)", op.name, falseDup, retryTrials, firstErr)
		}
	}
}

// TestClaimsRetriedDuringADebugSleepAreOwn stalls a real server with DEBUG SLEEP so that real
// read timeouts fire while commands queue on the server; go-redis retries them, and on
// waking the server runs the first attempt as well as the retries.
func TestClaimsRetriedDuringADebugSleepAreOwn(t *testing.T) {
	const (
		sleep       = 250 * time.Millisecond
		readTimeout = 100 * time.Millisecond
		perRound    = 10
		rounds      = retryTrials / perRound
		warmConns   = 48
	)
	addr := spawnRedis(t, "--enable-debug-command", "local")
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()

	// Four attempts (default MaxRetries 3) take at least 4*100ms of read timeouts plus
	// three backoffs of 20..40ms: the last one is sent well after the server wakes.
	c := redis.NewClient(&redis.Options{
		Addr:            addr,
		ReadTimeout:     readTimeout,
		MinRetryBackoff: 20 * time.Millisecond,
		MaxRetryBackoff: 40 * time.Millisecond,
		PoolSize:        64,
	})
	defer c.Close()
	ctl := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 5 * time.Second, PoolSize: 4})
	defer ctl.Close()
	if err := ctl.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	prefix := testenv.Prefix()
	if _, err := claim1(ctx, s, prefix+":warm:claim", "warm", "", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := mark1(ctx, s, prefix+":warm:mark", "warm", "", time.Minute); err != nil {
		t.Fatal(err)
	}

	// warm fills the pool with idle connections: a retry takes one of those rather than
	// dialing while the server sleeps (a handshake timeout is not retried).
	warm := func() {
		t.Helper()
		conns := make([]*redis.Conn, warmConns)
		for i := range conns {
			conns[i] = c.Conn()
			if err := conns[i].Ping(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		for _, cn := range conns {
			cn.Close()
		}
		if n := c.PoolStats().IdleConns; n < warmConns {
			t.Fatalf("%d idle connections after warm-up, want %d", n, warmConns)
		}
	}

	for _, op := range retryOps() {
		var falseDup, fast, badRecord int
		var firstErr error
		for r := range rounds {
			keys := make([]string, perRound)
			tokens := make([]string, perRound)
			for i := range keys {
				keys[i] = fmt.Sprintf("%s:%s:%d:%d", prefix, op.name, r, i)
				tokens[i] = fmt.Sprintf("r%dt%d", r, i)
			}
			if n, err := ctl.Exists(ctx, keys...).Result(); err != nil || n != 0 {
				t.Fatalf("%s round %d: %d trial keys exist before the round (%v)", op.name, r, n, err)
			}
			warm()

			sleepDone := make(chan error, 1)
			go func() { sleepDone <- ctl.Do(ctx, "DEBUG", "SLEEP", sleep.Seconds()).Err() }()
			time.Sleep(20 * time.Millisecond) // the server is asleep now

			own := make([]bool, perRound)
			errs := make([]error, perRound)
			took := make([]time.Duration, perRound)
			var wg sync.WaitGroup
			for i := range keys {
				wg.Add(1)
				go func() {
					defer wg.Done()
					start := time.Now()
					own[i], errs[i] = op.run(ctx, c, keys[i], tokens[i])
					took[i] = time.Since(start)
				}()
			}
			wg.Wait()
			if err := <-sleepDone; err != nil {
				t.Fatalf("DEBUG SLEEP: %v", err)
			}

			vals, err := ctl.MGet(ctx, keys...).Result()
			if err != nil {
				t.Fatal(err)
			}
			for i := range keys {
				if !own[i] {
					falseDup++
					if errs[i] != nil && firstErr == nil {
						firstErr = errs[i]
					}
				}
				if took[i] <= readTimeout {
					fast++
				}
				if v, _ := vals[i].(string); !strings.HasPrefix(v, op.recordPrefix(tokens[i])) {
					badRecord++
					t.Logf("%s round %d trial %d: record %q, want prefix %q", op.name, r, i, v, op.recordPrefix(tokens[i]))
				}
			}
		}
		t.Logf("%s: %d/%d false duplicates under DEBUG SLEEP", op.name, falseDup, retryTrials)
		if fast != 0 {
			t.Errorf("%s: %d calls took no longer than ReadTimeout %v: the server was not stalled", op.name, fast, readTimeout)
		}
		if badRecord != 0 {
			t.Errorf("%s: %d trials left no record of their own on the server", op.name, badRecord)
		}
		if op.naive {
			if falseDup < 50 {
				t.Errorf("naive SETNX: %d/%d false duplicates, want >= 50: the stall did not bite", falseDup, retryTrials)
			}
		} else if falseDup != 0 {
			t.Errorf("%s: %d/%d retried calls were taken for duplicates (first error: %v)", op.name, falseDup, retryTrials, firstErr)
		}
	}
}
