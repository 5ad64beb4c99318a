package nats

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/internal/embedded"
	"github.com/dedupkit/dedupkit/internal/storekit"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// suffix is a random name part no other test (or run) shares on a shared server.
func suffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// eachServer runs body once on an in-process NATS server and once on the external
// server at DEDUP_NATS_URL (skipped, or failed under DEDUP_REQUIRE_SERVERS=1, when unset).
// The test and both cases run in parallel with other such tests: most of their time is
// spent waiting for AckWaits to pass, and every test has servers or names of its own.
func eachServer(t *testing.T, body func(t *testing.T, e *env)) {
	t.Helper()
	t.Parallel()
	t.Run("embedded", func(t *testing.T) {
		t.Parallel()
		srv, err := embedded.StartNATS(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Close)
		body(t, connect(t, srv.URL()))
	})
	t.Run("external", func(t *testing.T) {
		t.Parallel()
		url := os.Getenv("DEDUP_NATS_URL")
		if url == "" {
			testenv.SkipNoServer(t, "DEDUP_NATS_URL is not set")
		}
		body(t, connect(t, url))
	})
}

// env is one test's view of a server: a connection, and names of its own.
type env struct {
	t       *testing.T
	nc      *natsgo.Conn
	js      jetstream.JetStream
	id      string // random, in every stream name and subject of this test
	stream  jetstream.Stream
	subject string // the stream's subjects are subject.>
}

func connect(t *testing.T, url string) *env {
	t.Helper()
	nc, err := natsgo.Connect(url, natsgo.Name(t.Name()), natsgo.Timeout(2*time.Second))
	if err != nil {
		testenv.SkipNoServer(t, "nats at %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	id := suffix()
	return &env{t: t, nc: nc, js: js, id: id, subject: "dkt." + id}
}

// dupWindow is the stream's duplicate window: short, so that a test can republish a
// Nats-Msg-Id as a new message soon after.
const dupWindow = 200 * time.Millisecond

// newStream creates the test's stream (memory storage, subjects subject.>) and deletes
// it at cleanup.
func (e *env) newStream(mod ...func(*jetstream.StreamConfig)) jetstream.Stream {
	e.t.Helper()
	cfg := jetstream.StreamConfig{
		Name:       "DKT_" + e.id,
		Subjects:   []string{e.subject + ".>"},
		Storage:    jetstream.MemoryStorage,
		Duplicates: dupWindow,
	}
	for _, m := range mod {
		m(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := e.js.CreateStream(ctx, cfg)
	if err != nil {
		e.t.Fatalf("create stream: %v", err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := e.js.DeleteStream(ctx, cfg.Name); err != nil {
			e.t.Logf("delete stream %s: %v", cfg.Name, err)
		}
	})
	e.stream = s
	return s
}

// testAckWait is the AckWait of the tests' consumers: short, so redeliveries come soon.
const testAckWait = 600 * time.Millisecond

// consumer creates a durable pull consumer on the stream: explicit acks, AckWait
// testAckWait, MaxDeliver 5, unless mod says otherwise.
func (e *env) consumer(name string, mod ...func(*jetstream.ConsumerConfig)) jetstream.Consumer {
	e.t.Helper()
	cfg := jetstream.ConsumerConfig{
		Durable:    name,
		AckPolicy:  jetstream.AckExplicitPolicy,
		AckWait:    testAckWait,
		MaxDeliver: 5,
	}
	for _, m := range mod {
		m(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := e.stream.CreateConsumer(ctx, cfg)
	if err != nil {
		e.t.Fatalf("create consumer: %v", err)
	}
	return c
}

// publish stores a message on subject.<sub> with a Nats-Msg-Id (none when id is "")
// and extra headers given as name, value pairs.
func (e *env) publish(sub, id, data string, hdr ...string) *jetstream.PubAck {
	e.t.Helper()
	m := natsgo.NewMsg(e.subject + "." + sub)
	m.Data = []byte(data)
	if id != "" {
		m.Header.Set(jetstream.MsgIDHeader, id)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		m.Header.Set(hdr[i], hdr[i+1])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ack, err := e.js.PublishMsg(ctx, m)
	if err != nil {
		e.t.Fatalf("publish: %v", err)
	}
	return ack
}

// republish publishes a message with a Nats-Msg-Id already used, once the stream's
// duplicate window has forgotten it, so that the stream stores it as a new message.
func (e *env) republish(sub, id, data string, hdr ...string) *jetstream.PubAck {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ack := e.publish(sub, id, data, hdr...)
		if !ack.Duplicate {
			return ack
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("stream still treats %q as a duplicate after 10s", id)
		}
		time.Sleep(dupWindow / 4) // a poll: the server forgets ids on its own timer
	}
}

// info reads the consumer's state from the server.
func (e *env) info(c jetstream.Consumer) *jetstream.ConsumerInfo {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ci, err := c.Info(ctx)
	if err != nil {
		e.t.Fatalf("consumer info: %v", err)
	}
	return ci
}

// settled waits until the server has every message of the stream up to seq delivered
// and acknowledged (or terminated) by c.
func (e *env) settled(c jetstream.Consumer, seq uint64) *jetstream.ConsumerInfo {
	e.t.Helper()
	var ci *jetstream.ConsumerInfo
	testenv.Eventually(e.t, 15*time.Second, fmt.Sprintf("consumer acks up to stream seq %d", seq), func() bool {
		ci = e.info(c)
		return ci.NumAckPending == 0 && ci.NumPending == 0 && ci.AckFloor.Stream >= seq
	})
	return ci
}

// quietFor checks, for d (a few AckWaits), that the server delivers nothing more to c:
// its delivery count stays at deliveries and nothing is pending an ack.
func (e *env) quietFor(c jetstream.Consumer, d time.Duration, deliveries uint64) {
	e.t.Helper()
	consistently(e.t, d, func() string {
		ci := e.info(c)
		if ci.Delivered.Consumer != deliveries || ci.NumAckPending != 0 || ci.NumRedelivered != 0 {
			return fmt.Sprintf("server delivered %d times (want %d), %d pending ack, %d redelivered",
				ci.Delivered.Consumer, deliveries, ci.NumAckPending, ci.NumRedelivered)
		}
		return ""
	})
}

// consume runs h on c until the test ends, and waits at cleanup until it has stopped.
func consume(t *testing.T, c jetstream.Consumer, h jetstream.MessageHandler) jetstream.ConsumeContext {
	t.Helper()
	cc, err := c.Consume(h, jetstream.PullExpiry(2*time.Second), jetstream.ConsumeErrHandler(func(jetstream.ConsumeContext, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopConsume(t, cc) })
	return cc
}

// handling tracks the calls of a message handler that a test gives Consume itself
// (one calling Handle, and recording what it returned), so that the test can wait for
// them: a delivery's ack reaches the server, where settled sees it, before Handle
// returns, let alone before the callback has recorded its result, so anything read
// right after settled can miss the last delivery. (A JetStream or Core Handler is
// waited for with its own Wait.)
type handling struct{ wg sync.WaitGroup }

// wrap returns fn, tracked.
func (h *handling) wrap(fn jetstream.MessageHandler) jetstream.MessageHandler {
	return func(msg jetstream.Msg) {
		h.wg.Add(1)
		defer h.wg.Done()
		fn(msg)
	}
}

// wait returns once every call made so far has returned. Call it once nothing more
// is to be delivered (after settled): the acks the test has seen were sent by calls
// that had begun, so those are waited for.
func (h *handling) wait() { h.wg.Wait() }

func stopConsume(t *testing.T, cc jetstream.ConsumeContext) {
	cc.Stop()
	select {
	case <-cc.Closed():
	case <-time.After(10 * time.Second):
		t.Errorf("consume did not stop within 10s")
	}
}

// consistently polls check for d and fails the test as soon as it reports a problem.
func consistently(t testing.TB, d time.Duration, check func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if msg := check(); msg != "" {
			t.Fatal(msg)
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// newDeduper returns a Deduper over store, closed at cleanup.
func newDeduper(t *testing.T, store driver.Store, opts ...dedup.Option) *dedup.Deduper {
	t.Helper()
	d, err := dedup.New(store, append([]dedup.Option{dedup.WithLogger(quiet)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func memStore(t *testing.T) *memstore.Store {
	t.Helper()
	s, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func register(t *testing.T, d *dedup.Deduper, name string, opts ...dedup.HandlerOption) *dedup.Handler {
	t.Helper()
	h, err := d.Register(name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// newJS wraps h for c, with a quiet logger.
func newJS(t *testing.T, h *dedup.Handler, c jetstream.Consumer, opts ...Option) *JetStream {
	t.Helper()
	j, err := NewJetStream(h, c, append([]Option{WithLogger(quiet)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// isDone reports whether key's record for h is DONE in store (a probe claim answers
// Duplicate); a probe that acquires the key releases it again.
func isDone(t *testing.T, store driver.Store, h *dedup.Handler, key string) bool {
	t.Helper()
	ctx := context.Background()
	rk := h.RecordKey(key)
	a, err := storekit.Only(store.Claim(ctx, oneEntry(rk, "probe", "", time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	if a.Status == driver.StatusAcquired {
		if err := storekit.OnlyErr(store.Release(ctx, oneEntry(rk, "probe", "", 0))); err != nil {
			t.Fatal(err)
		}
	}
	return a.Status == driver.StatusDuplicate
}

// runs counts handler runs by message key (the Nats-Msg-Id, else the payload).
type runs struct {
	mu sync.Mutex
	by map[string]int
	n  atomic.Int64
}

func (r *runs) add(m *Msg) {
	k := m.Header(jetstream.MsgIDHeader)
	if k == "" {
		k = string(m.Data())
	}
	r.mu.Lock()
	if r.by == nil {
		r.by = make(map[string]int)
	}
	r.by[k]++
	r.mu.Unlock()
	r.n.Add(1)
}

// all returns a copy of the counts, for messages.
func (r *runs) all() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := make(map[string]int, len(r.by))
	for k, v := range r.by {
		m[k] = v
	}
	return m
}

func (r *runs) of(k string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.by[k]
}

// --- stores ---------------------------------------------------------------------------

// flakyStore wraps a Store and lets a test fail any operation, by its method's name
// ("claim", "mark", "complete", "release", "extend"), whatever the size of the batch.
type flakyStore struct {
	driver.Store
	fail atomic.Pointer[func(op string) error]
}

// down makes every operation fail with ErrStoreUnavailable (or, with false, heals).
func (s *flakyStore) down(on bool) {
	if !on {
		s.fail.Store(nil)
		return
	}
	s.onFail(func(op string) error { return fmt.Errorf("%w: %s: injected outage", dedup.ErrStoreUnavailable, op) })
}

func (s *flakyStore) onFail(f func(op string) error) { s.fail.Store(&f) }

func (s *flakyStore) hook(op string) error {
	if f := s.fail.Load(); f != nil {
		return (*f)(op)
	}
	return nil
}

// failed answers a call of n entries that the hook failed with err: ErrLeaseLost,
// an entry's own answer, in each entry's slot; another error as the call's.
func failed[A any](n int, err error, slot func(error) A) ([]A, error) {
	if !errors.Is(err, dedup.ErrLeaseLost) {
		return nil, err
	}
	out := make([]A, n)
	for i := range out {
		out[i] = slot(err)
	}
	return out, nil
}

func answerErr(err error) driver.Answer { return driver.Answer{Err: err} }
func sameErr(err error) error           { return err }

func (s *flakyStore) Claim(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	if err := s.hook("claim"); err != nil {
		return failed(len(entries), err, answerErr)
	}
	return s.Store.Claim(ctx, entries)
}

func (s *flakyStore) Mark(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	if err := s.hook("mark"); err != nil {
		return failed(len(entries), err, answerErr)
	}
	return s.Store.Mark(ctx, entries)
}

func (s *flakyStore) Complete(ctx context.Context, entries []driver.Entry) ([]error, error) {
	if err := s.hook("complete"); err != nil {
		return failed(len(entries), err, sameErr)
	}
	return s.Store.Complete(ctx, entries)
}

func (s *flakyStore) Release(ctx context.Context, entries []driver.Entry) ([]error, error) {
	if err := s.hook("release"); err != nil {
		return failed(len(entries), err, sameErr)
	}
	return s.Store.Release(ctx, entries)
}

func (s *flakyStore) Extend(ctx context.Context, entries []driver.Entry) ([]error, error) {
	if err := s.hook("extend"); err != nil {
		return failed(len(entries), err, sameErr)
	}
	return s.Store.Extend(ctx, entries)
}

// oneEntry is a batch of one entry.
func oneEntry(key, token, fp string, ttl time.Duration) []driver.Entry {
	return []driver.Entry{{Key: key, Token: token, Fingerprint: fp, TTL: ttl}}
}

// --- redis ----------------------------------------------------------------------------

// redisClients returns, per case, a Redis client and a key prefix of its own: miniredis,
// and the real server at DEDUP_REDIS_ADDR (skipped, or failed under
// DEDUP_REQUIRE_SERVERS=1, when unset). The prefix's keys are deleted at cleanup, by
// SCAN: the real server is shared, so never FLUSHDB.
func redisClients() map[string]func(t *testing.T) (*redis.Client, string) {
	return map[string]func(t *testing.T) (*redis.Client, string){
		"miniredis": func(t *testing.T) (*redis.Client, string) {
			m, err := embedded.StartRedis()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(m.Close)
			c := redis.NewClient(&redis.Options{Addr: m.Addr()})
			t.Cleanup(func() { c.Close() })
			return c, testenv.Prefix()
		},
		"redis-server": func(t *testing.T) (*redis.Client, string) {
			addr := os.Getenv("DEDUP_REDIS_ADDR")
			if addr == "" {
				testenv.SkipNoServer(t, "DEDUP_REDIS_ADDR is not set")
			}
			c := redis.NewClient(&redis.Options{Addr: addr})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if err := c.Ping(ctx).Err(); err != nil {
				c.Close()
				testenv.SkipNoServer(t, "redis at DEDUP_REDIS_ADDR=%s: %v", addr, err)
			}
			prefix := testenv.Prefix()
			t.Cleanup(func() {
				testenv.DeletePrefix(t, c, prefix)
				c.Close()
			})
			return c, prefix
		},
	}
}
