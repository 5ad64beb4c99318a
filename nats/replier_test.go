package nats

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/embedded"
	"github.com/dedupkit/dedupkit/internal/testenv"
	"github.com/dedupkit/dedupkit/keys"
)

// replyStores are the stores the Replier tests run on, each with the prefix its
// Dedupers use: memory, miniredis, and the real server at DEDUP_REDIS_ADDR.
func replyStores() map[string]func(t *testing.T) (driver.Store, string) {
	out := map[string]func(t *testing.T) (driver.Store, string){
		"memory": func(t *testing.T) (driver.Store, string) { return memStore(t), dedup.DefaultPrefix },
	}
	for name, mk := range redisClients() {
		out[name] = func(t *testing.T) (driver.Store, string) {
			c, prefix := mk(t)
			s, err := redisstore.New(c)
			if err != nil {
				t.Fatal(err)
			}
			return s, prefix
		}
	}
	return out
}

// eachReplyCase runs body on every NATS server (eachServer) and store.
func eachReplyCase(t *testing.T, body func(t *testing.T, e *env, store driver.Store, prefix string)) {
	eachServer(t, func(t *testing.T, e *env) {
		for _, name := range slices.Sorted(maps.Keys(replyStores())) {
			t.Run(name, func(t *testing.T) {
				store, prefix := replyStores()[name](t)
				body(t, e, store, prefix)
			})
		}
	})
}

// newReplier registers a handler WithReplies(limit) on a Deduper of its own (a process
// of its own) over store, and wraps it; handlers of other Dedupers share its records.
func newReplier(t *testing.T, store driver.Store, prefix string, limit int, opts ...dedup.HandlerOption) (*Replier, *dedup.Handler) {
	t.Helper()
	h := register(t, newDeduper(t, store, dedup.WithPrefix(prefix)), "orders", append([]dedup.HandlerOption{dedup.WithReplies(limit)}, opts...)...)
	r, err := NewReplier(h, WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	return r, h
}

// serveCore subscribes r on subject (in queue group q when not ""), until the test
// ends: then it drains the subscription and waits for the requests in hand.
//
// A Replier counts a reply once it is sent, so the requester can have it before it
// is counted, and a later request can be answered and counted first: a test reads
// r.Stats() after r.Wait(), which returns once every request r has taken (every one
// whose reply came back) has been answered and counted.
func serveCore(t *testing.T, nc *natsgo.Conn, subject, q string, r *Replier, fn ReplyFunc) {
	t.Helper()
	var sub *natsgo.Subscription
	var err error
	if q == "" {
		sub, err = nc.Subscribe(subject, r.Handler(context.Background(), fn))
	} else {
		sub, err = nc.QueueSubscribe(subject, q, r.Handler(context.Background(), fn))
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sub.Unsubscribe()
		r.Wait()
	})
}

// request sends a request with Idempotency-Key key (none when "") and waits for its
// reply.
func request(nc *natsgo.Conn, subject, key string, data []byte, timeout time.Duration) (*natsgo.Msg, error) {
	m := natsgo.NewMsg(subject)
	m.Data = data
	if key != "" {
		m.Header.Set("Idempotency-Key", key)
	}
	return nc.RequestMsg(m, timeout)
}

// wantError checks an error reply: micro's headers, with code.
func wantError(t *testing.T, m *natsgo.Msg, err error, code string) {
	t.Helper()
	if err != nil {
		t.Fatalf("no reply (want %s): %v", code, err)
	}
	if got := m.Header.Get(micro.ErrorCodeHeader); got != code || m.Header.Get(micro.ErrorHeader) == "" {
		t.Fatalf("reply %q with headers %v, want an error reply %s", m.Data, m.Header, code)
	}
}

// theReply is a reply with headers of several values, a lower-case name, and data
// holding every byte value: it must come back byte for byte.
func theReply() Reply {
	data := make([]byte, 0, 300)
	for i := range 256 {
		data = append(data, byte(i))
	}
	data = append(data, "\r\nNATS/1.0\r\n\r\n"...)
	return Reply{
		Header: natsgo.Header{"Order-Id": {"o-42"}, "X-Multi": {"one", "two", "three"}, "x-lower-case": {"v"}},
		Data:   data,
	}
}

func sameReply(t *testing.T, what string, m *natsgo.Msg, want Reply) {
	t.Helper()
	if !bytes.Equal(m.Data, want.Data) || !reflect.DeepEqual(m.Header, want.Header) {
		t.Fatalf("%s: reply %q %v, want %q %v", what, m.Data, m.Header, want.Data, want.Header)
	}
}

// A client whose first request's reply was lost (its reply subject had no
// subscriber any more: it timed out and gave up on it) retries with the same key and
// gets the first run's reply, headers and binary data byte for byte; fn ran once.
// Without stored replies the retry is dropped (silence) or answered 409.
func TestReplierRetryAfterALostReplyGetsTheStoredReply(t *testing.T) {
	eachReplyCase(t, func(t *testing.T, e *env, store driver.Store, prefix string) {
		r, h := newReplier(t, store, prefix, 0)
		var runs atomic.Int32
		ran := make(chan struct{})
		var once sync.Once
		subject := e.subject + ".create"
		serveCore(t, e.nc, subject, "", r, func(_ context.Context, m *Msg) (Reply, error) {
			runs.Add(1)
			once.Do(func() { close(ran) })
			if string(m.Data()) != "create o-42" {
				return Reply{}, fmt.Errorf("request %q", m.Data())
			}
			return theReply(), nil
		})
		first := natsgo.NewMsg(subject)
		first.Header.Set("Idempotency-Key", "req-1")
		first.Data = []byte("create o-42")
		first.Reply = e.nc.NewRespInbox() // nobody listens: the reply is lost
		if err := e.nc.PublishMsg(first); err != nil {
			t.Fatal(err)
		}
		select { // the request taken: nothing shows its lost reply but the count
		case <-ran:
		case <-time.After(5 * time.Second):
			t.Fatal("the first request did not run")
		}
		r.Wait()
		if n := r.Stats().Count(ReplyRun); n != 1 {
			t.Fatalf("the first request answered %d times", n)
		}
		for i := range 2 { // from the local tier, then again
			m, err := request(e.nc, subject, "req-1", []byte("create o-42"), 5*time.Second)
			if err != nil {
				t.Fatalf("retry %d: %v", i, err)
			}
			sameReply(t, fmt.Sprint("retry ", i), m, theReply())
		}
		// another process, whose local tier has never seen it: from the store
		other, _ := newReplier(t, store, prefix, 0)
		m := natsgo.NewMsg(subject)
		m.Header.Set("Idempotency-Key", "req-1")
		m.Data = []byte("create o-42")
		var got Reply
		res, err := other.Handle(context.Background(), &natsgo.Msg{Subject: subject, Header: m.Header, Data: m.Data}, func(context.Context, *Msg) (Reply, error) {
			runs.Add(1)
			return Reply{}, nil
		})
		if err != nil || res.Outcome != dedup.Duplicate || res.Tier != dedup.TierStore {
			t.Fatalf("another process: %+v %v", res, err)
		}
		if got, err = decodeReply(res.Reply); err != nil || !bytes.Equal(got.Data, theReply().Data) || !reflect.DeepEqual(got.Header, theReply().Header) {
			t.Fatalf("another process's stored reply: %v %q", err, got.Data)
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("fn ran %d times", n)
		}
		r.Wait()
		if s := r.Stats(); s.Count(ReplyStored) != 2 || s.RespondErrors != 0 {
			t.Fatalf("stats: %+v", s)
		}
		if hs := h.Stats(); hs.Count(dedup.Processed) != 1 || hs.Count(dedup.Duplicate) != 2 {
			t.Fatalf("handler stats: %+v", hs)
		}
	})
}

// Concurrent copies of one request, to two instances (a queue group, two processes on
// one store): one run, and every copy answered: the stored reply (copies that reach
// the running instance wait for its run), or a retryable 503 with the lease left
// (copies that reach the other); retried, those get the stored reply. None is left
// without an answer.
func TestReplierRunsConcurrentCopiesOnceAndAnswersEach(t *testing.T) {
	eachReplyCase(t, func(t *testing.T, e *env, store driver.Store, prefix string) {
		subject := e.subject + ".create"
		var runs atomic.Int32
		fn := func(context.Context, *Msg) (Reply, error) {
			runs.Add(1)
			time.Sleep(300 * time.Millisecond)
			return theReply(), nil
		}
		for range 2 {
			r, _ := newReplier(t, store, prefix, 0)
			serveCore(t, e.nc, subject, "q", r, fn)
		}
		const copies = 12
		var wg sync.WaitGroup
		var mu sync.Mutex
		kinds := map[string]int{}
		for i := range copies {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for attempt := 0; ; attempt++ {
					m, err := request(e.nc, subject, "req-1", []byte("create"), 5*time.Second)
					if err != nil {
						t.Errorf("copy %d: no answer: %v", i, err)
						return
					}
					if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
						ms, _ := strconv.Atoi(m.Header.Get(RetryAfterHeader))
						if code != CodeRetry || ms <= 0 || attempt > 20 {
							t.Errorf("copy %d: error reply %s %q, retry after %q", i, code, m.Header.Get(micro.ErrorHeader), m.Header.Get(RetryAfterHeader))
							return
						}
						mu.Lock()
						kinds["retry"]++
						mu.Unlock()
						time.Sleep(time.Duration(ms) * time.Millisecond)
						continue
					}
					if !bytes.Equal(m.Data, theReply().Data) || !reflect.DeepEqual(m.Header, theReply().Header) {
						t.Errorf("copy %d: reply %q %v", i, m.Data, m.Header)
					}
					mu.Lock()
					kinds["reply"]++
					mu.Unlock()
					return
				}
			}()
		}
		wg.Wait()
		if runs.Load() != 1 || kinds["reply"] != copies {
			t.Fatalf("fn ran %d times; answers %v", runs.Load(), kinds)
		}
		t.Logf("answers: %v", kinds)
	})
}

// A reply larger than the handler's limit reaches the first requester all the same,
// is not stored, and its duplicates get 409 (processed, reply not stored): never a
// run again, never silence. The handler counts it.
func TestReplierSendsATooLargeReplyOnceAndAnswersItsCopies409(t *testing.T) {
	eachReplyCase(t, func(t *testing.T, e *env, store driver.Store, prefix string) {
		r, h := newReplier(t, store, prefix, 64)
		subject := e.subject + ".create"
		var runs atomic.Int32
		serveCore(t, e.nc, subject, "", r, func(context.Context, *Msg) (Reply, error) {
			runs.Add(1)
			return Reply{Data: bytes.Repeat([]byte("L"), 100)}, nil
		})
		m, err := request(e.nc, subject, "req-1", nil, 5*time.Second)
		if err != nil || len(m.Data) != 100 || m.Header.Get(micro.ErrorCodeHeader) != "" {
			t.Fatalf("first: %v %v %d bytes", err, m.Header, len(m.Data))
		}
		m, err = request(e.nc, subject, "req-1", nil, 5*time.Second)
		wantError(t, m, err, CodeNotStored)
		r.Wait()
		if runs.Load() != 1 || h.Stats().RepliesTooLarge != 1 || h.Stats().RepliesMissing != 1 ||
			r.Stats().Count(ReplyRun) != 1 || r.Stats().Count(ReplyNotStored) != 1 {
			t.Fatalf("runs %d, handler %+v, replier %+v", runs.Load(), h.Stats(), r.Stats())
		}
	})
}

// fn's error is an error reply (500, or its ServiceError's code and data) and
// releases the claim: the retry runs fn again, and its reply is the one stored. A
// panic, and an fn that ends its goroutine, are 500 too; a request without a key is
// 400, a key reused with another payload 422.
func TestReplierAnswersErrorsWithStatusCodes(t *testing.T) {
	eachReplyCase(t, func(t *testing.T, e *env, store driver.Store, prefix string) {
		r, _ := newReplier(t, store, prefix, 0, dedup.WithFingerprint(true))
		subject := e.subject + ".create"
		var runs sync.Map // key → *atomic.Int32
		serveCore(t, e.nc, subject, "", r, func(_ context.Context, m *Msg) (Reply, error) {
			k := m.Header("Idempotency-Key")
			n, _ := runs.LoadOrStore(k, new(atomic.Int32))
			switch c := n.(*atomic.Int32).Add(1); {
			case k == "fails-once" && c == 1:
				return Reply{}, errors.New("internal detail that must not reach the client")
			case k == "rejected":
				return Reply{}, &ServiceError{Code: "404", Description: "no such sku", Data: []byte(`{"sku":"x"}`)}
			case k == "panics":
				panic("boom")
			case k == "exits":
				runtime.Goexit()
			}
			return Reply{Data: []byte("ok " + k)}, nil
		})
		m, err := request(e.nc, subject, "fails-once", []byte("p"), 5*time.Second)
		wantError(t, m, err, CodeFailed)
		if d := m.Header.Get(micro.ErrorHeader); d != DescFailed {
			t.Fatalf("description %q", d)
		}
		m, err = request(e.nc, subject, "fails-once", []byte("p"), 5*time.Second)
		if err != nil || string(m.Data) != "ok fails-once" {
			t.Fatalf("retry after the failure: %v %q %v", err, m.Data, m.Header)
		}
		m, err = request(e.nc, subject, "fails-once", []byte("p"), 5*time.Second)
		if err != nil || string(m.Data) != "ok fails-once" {
			t.Fatalf("duplicate: %v %q", err, m.Data)
		}
		m, err = request(e.nc, subject, "rejected", []byte("p"), 5*time.Second)
		wantError(t, m, err, "404")
		if m.Header.Get(micro.ErrorHeader) != "no such sku" || string(m.Data) != `{"sku":"x"}` {
			t.Fatalf("service error: %v %q", m.Header, m.Data)
		}
		m, err = request(e.nc, subject, "panics", []byte("p"), 5*time.Second)
		wantError(t, m, err, CodeFailed)
		m, err = request(e.nc, subject, "exits", []byte("p"), 5*time.Second)
		wantError(t, m, err, CodeFailed)
		m, err = request(e.nc, subject, "", []byte("p"), 5*time.Second)
		wantError(t, m, err, CodeNoKey)
		m, err = request(e.nc, subject, "fails-once", []byte("another payload"), 5*time.Second)
		wantError(t, m, err, CodeKeyReuse)
		for k, want := range map[string]int32{"fails-once": 2, "rejected": 1, "panics": 1, "exits": 1} {
			if n, _ := runs.Load(k); n.(*atomic.Int32).Load() != want {
				t.Fatalf("%s ran %d times, want %d", k, n.(*atomic.Int32).Load(), want)
			}
		}
		r.Wait()
		s := r.Stats()
		if s.Count(ReplyRun) != 1 || s.Count(ReplyStored) != 1 || s.Count(ReplyError) != 4 || s.Count(ReplyRejected) != 2 {
			t.Fatalf("stats: %+v", s)
		}
	})
}

// With Redis down, a request is answered 503 (fail closed: fn not run), never left
// without an answer; once Redis is back, the retry runs.
func TestReplierAnswers503WhileTheStoreIsDown(t *testing.T) {
	eachServer(t, func(t *testing.T, e *env) {
		// each case's prefix: the real server's keys under it are deleted at cleanup
		cases := map[string]func(t *testing.T) (addr string, down func(), prefix string){
			"miniredis": func(t *testing.T) (string, func(), string) {
				m, err := embedded.StartRedis()
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(m.Close)
				p, err := testenv.NewProxy(m.Addr())
				if err != nil {
					t.Fatal(err)
				}
				return p.Addr(), func() { _ = p.Close() }, testenv.Prefix()
			},
			"redis-server": func(t *testing.T) (string, func(), string) {
				c, prefix := redisClients()["redis-server"](t)
				p, err := testenv.NewProxy(c.Options().Addr)
				if err != nil {
					t.Fatal(err)
				}
				return p.Addr(), func() { _ = p.Close() }, prefix
			},
		}
		for _, name := range []string{"miniredis", "redis-server"} {
			t.Run(name, func(t *testing.T) {
				addr, down, prefix := cases[name](t)
				c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
				t.Cleanup(func() { c.Close() })
				store, err := redisstore.New(c)
				if err != nil {
					t.Fatal(err)
				}
				r, _ := newReplier(t, store, prefix, 0)
				subject := e.subject + ".create." + name
				var runs atomic.Int32
				serveCore(t, e.nc, subject, "", r, func(context.Context, *Msg) (Reply, error) {
					runs.Add(1)
					return Reply{Data: []byte("created")}, nil
				})
				if m, err := request(e.nc, subject, "req-0", nil, 5*time.Second); err != nil || string(m.Data) != "created" {
					t.Fatalf("while up: %v", err)
				}
				down()
				m, err := request(e.nc, subject, "req-1", nil, 5*time.Second)
				wantError(t, m, err, CodeRetry)
				if d := m.Header.Get(micro.ErrorHeader); d != DescStoreUnavailable {
					t.Fatalf("description %q", d)
				}
				r.Wait()
				if runs.Load() != 1 || r.Stats().Count(ReplyRetry) != 1 {
					t.Fatalf("fn ran %d times; %+v", runs.Load(), r.Stats())
				}
			})
		}
	})
}

// The Replier needs a handler that stores replies; its key strategy defaults to the
// engine's (Idempotency-Key, else Nats-Msg-Id) unless the handler or an option sets
// one.
func TestReplierNeedsStoredRepliesAndTakesTheEnginesKeyStrategy(t *testing.T) {
	d := newDeduper(t, memStore(t))
	if _, err := NewReplier(register(t, d, "plain")); !errors.Is(err, dedup.ErrInvalidOption) {
		t.Fatalf("a handler without replies: %v", err)
	}
	r, err := NewReplier(register(t, d, "replies", dedup.WithReplies(0)))
	if err != nil {
		t.Fatal(err)
	}
	m := &Msg{header: natsgo.Header{"Nats-Msg-Id": {"id"}}}
	if k := r.a.cfg.strategy.Key(m); k != "id" {
		t.Fatalf("default strategy found %q", k)
	}
	m.header.Set("Idempotency-Key", "ik")
	if k := r.a.cfg.strategy.Key(m); k != "ik" {
		t.Fatalf("default strategy found %q", k)
	}
	m.header.Set("Request-Id", "rid")
	own := register(t, d, "own", dedup.WithReplies(0), dedup.WithKeyStrategy(keys.Header("Request-Id")))
	if r, _ = NewReplier(own); r.a.cfg.strategy.Key(m) != "rid" {
		t.Fatalf("the handler's strategy found %q", r.a.cfg.strategy.Key(m))
	}
	if r, _ = NewReplier(own, WithKeyStrategy(keys.Header("Nats-Msg-Id"))); r.a.cfg.strategy.Key(m) != "id" {
		t.Fatalf("the Replier's strategy found %q", r.a.cfg.strategy.Key(m))
	}
	if _, err := NewReplier(own, WithRetryAfter(0)); !errors.Is(err, dedup.ErrInvalidOption) {
		t.Fatalf("WithRetryAfter(0): %v", err)
	}
}

// An idempotent micro endpoint is one line, and the service's stats stay right:
// every request counts in num_requests; the error replies (fn's error, a request
// without a key, one in progress in another process) in num_errors, with the last
// one's description; a duplicate answered with the stored reply is a success.
func TestMicroEndpointCountsRequestsAndErrorsRight(t *testing.T) {
	eachReplyCase(t, func(t *testing.T, e *env, store driver.Store, prefix string) {
		r, _ := newReplier(t, store, prefix, 0)
		var runs atomic.Int32
		fn := func(_ context.Context, m *Msg) (Reply, error) {
			runs.Add(1)
			if string(m.Data()) == "bad" {
				return Reply{}, &ServiceError{Code: "400", Description: "bad order"}
			}
			return theReply(), nil
		}
		svc, err := micro.AddService(e.nc, micro.Config{Name: "orders", Version: "1.0.0"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = svc.Stop()
			r.Wait()
		})
		subject := e.subject + ".micro.create"
		if err := svc.AddEndpoint("create", r.MicroHandler(context.Background(), fn), micro.WithEndpointSubject(subject)); err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			m, err := request(e.nc, subject, "req-1", []byte("order"), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			sameReply(t, fmt.Sprint("request ", i), m, theReply())
		}
		m, err := request(e.nc, subject, "req-2", []byte("bad"), 5*time.Second)
		wantError(t, m, err, "400")
		m, err = request(e.nc, subject, "", []byte("order"), 5*time.Second)
		wantError(t, m, err, CodeNoKey)

		// in progress in another process: 503, with what is left of its lease
		other, _ := newReplier(t, store, prefix, 0)
		started, finish := make(chan struct{}), make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			other.Handle(context.Background(), &natsgo.Msg{Subject: subject, Header: natsgo.Header{"Idempotency-Key": {"req-3"}}},
				func(context.Context, *Msg) (Reply, error) {
					close(started)
					<-finish
					return Reply{Data: []byte("third")}, nil
				})
		}()
		<-started
		m, err = request(e.nc, subject, "req-3", []byte("order"), 5*time.Second)
		wantError(t, m, err, CodeRetry)
		if m.Header.Get(RetryAfterHeader) == "" {
			t.Fatalf("no %s: %v", RetryAfterHeader, m.Header)
		}
		close(finish)
		<-done
		m, err = request(e.nc, subject, "req-3", []byte("order"), 5*time.Second)
		if err != nil || string(m.Data) != "third" {
			t.Fatalf("after the other run: %v %q", err, m.Data)
		}

		// micro counts a request once its handler has returned, after the reply went out
		callbacksReturned(t, e.nc)
		st := svc.Stats().Endpoints[0]
		if st.NumRequests != 6 || st.NumErrors != 3 || st.LastError != "503:"+DescInProgress {
			t.Fatalf("endpoint stats: %d requests, %d errors, last %q", st.NumRequests, st.NumErrors, st.LastError)
		}
		if runs.Load() != 2 {
			t.Fatalf("fn ran %d times", runs.Load())
		}
	})
}

// callbacksReturned waits until every subscription of nc with a callback has returned
// from its calls for the messages nc has received (nc.Barrier): a micro endpoint's
// calls include micro's own counting, which its stats show once they return.
func callbacksReturned(t *testing.T, nc *natsgo.Conn) {
	t.Helper()
	done := make(chan struct{})
	if err := nc.Barrier(func() { close(done) }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the subscriptions' callbacks did not return within 10s")
	}
}
