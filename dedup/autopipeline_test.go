package dedup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/internal/testenv"
)

// The store's single calls through go-redis's AutoPipeline (issue 27, point 4: it
// replaced dedup's own auto-pipeliner, which did not beat it by 1.2x). These are the
// failure cases of that auto-pipeliner's tests, carried over.

// goid returns the current goroutine's id, read from its stack header.
func goid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	id, _ := strconv.ParseUint(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return id
}

// gateHook holds every round trip until the gate opens, and records how many
// commands each carried and whether it was a single command or a pipeline.
type gateHook struct {
	gate chan struct{}
	mu   sync.Mutex
	runs []gateRun
	// entered receives once per round trip, before it waits at the gate
	entered chan struct{}
}

type gateRun struct {
	cmds     int
	pipeline bool
}

func newGateHook() *gateHook {
	return &gateHook{gate: make(chan struct{}), entered: make(chan struct{}, 1024)}
}

func (g *gateHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if testenv.IsHandshake(cmd) {
			return next(ctx, cmd)
		}
		g.record(1, false)
		return next(ctx, cmd)
	}
}

func (g *gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && testenv.IsHandshake(cmds[0]) {
			return next(ctx, cmds)
		}
		g.record(len(cmds), true)
		return next(ctx, cmds)
	}
}

func (g *gateHook) record(n int, pipeline bool) {
	g.mu.Lock()
	g.runs = append(g.runs, gateRun{cmds: n, pipeline: pipeline})
	g.mu.Unlock()
	g.entered <- struct{}{}
	<-g.gate
}

func (g *gateHook) snapshot() []gateRun {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]gateRun(nil), g.runs...)
}

// gatedStore is a store over a miniredis client with a gateHook, and a prefix.
func gatedStore(t *testing.T, opts ...RedisOption) (*RedisStore, *gateHook, string) {
	t.Helper()
	_, c := newMiniredis(t)
	g := newGateHook()
	c.AddHook(g)
	s, err := NewRedisStore(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s, g, testenv.Prefix()
}

// holdFirst starts a Mark of key and waits until its round trip is at the gate.
func holdFirst(t *testing.T, s *RedisStore, g *gateHook, key string) <-chan error {
	t.Helper()
	first := make(chan error, 1)
	go func() {
		_, err := s.Mark(context.Background(), key, "T", "", time.Minute)
		first <- err
	}()
	<-g.entered
	return first
}

// A lone caller's calls go out one round trip each, at once: nothing waits for
// company.
func TestAutoPipelineLoneCallGoesOutAtOnce(t *testing.T) {
	s, g, prefix := gatedStore(t)
	close(g.gate)
	for i := range 5 {
		start := time.Now()
		a, err := s.Mark(context.Background(), fmt.Sprintf("%s:k%d", prefix, i), "T", "", time.Minute)
		if err != nil || a.Status != StatusAcquired {
			t.Fatalf("mark %d: %v %v", i, a.Status, err)
		}
		if took := time.Since(start); took > time.Second {
			t.Fatalf("mark %d took %v", i, took)
		}
	}
	runs := g.snapshot()
	if len(runs) != 5 {
		t.Fatalf("%d round trips for 5 sequential calls (%+v), want 5", len(runs), runs)
	}
	for i, r := range runs {
		if r.cmds != 1 {
			t.Fatalf("round trip %d: %+v, want 1 command", i, r)
		}
	}
}

// Calls that arrive while a round trip is out share the next ones, and each gets its
// own command's reply, error replies included; of two calls on one key, one is
// Acquired and the other finds its record.
func TestAutoPipelineCoalescesAndRepliesReachTheirCallers(t *testing.T) {
	m, c := newMiniredis(t)
	prefix := testenv.Prefix()
	if _, err := m.Lpush(prefix+":list", "x"); err != nil {
		t.Fatal(err)
	}
	if err := m.Set(prefix+":done", encodeRecord(stateDone, "other", "")); err != nil {
		t.Fatal(err)
	}
	g := newGateHook()
	c.AddHook(g)
	s, err := NewRedisStore(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	first := holdFirst(t, s, g, prefix+":first")
	const fresh = 20
	keys := []string{"list", "done", "same", "same"}
	for i := 1; i <= fresh; i++ {
		keys = append(keys, fmt.Sprintf("new%d", i))
	}
	type reply struct {
		a   Answer
		err error
	}
	replies := make([]chan reply, len(keys))
	for i, k := range keys {
		replies[i] = make(chan reply, 1)
		go func() {
			a, err := s.Mark(ctx, prefix+":"+k, "T"+strconv.Itoa(i), "", time.Minute)
			replies[i] <- reply{a, err}
		}()
	}
	time.Sleep(100 * time.Millisecond) // the calls queue behind the held round trip
	close(g.gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	same := map[Status]int{}
	for i, k := range keys {
		r := <-replies[i]
		switch k {
		case "list":
			if !errors.Is(r.err, ErrStoreUnavailable) {
				t.Fatalf("%s: %v %v, want a WRONGTYPE store error", k, r.a.Status, r.err)
			}
		case "same":
			if r.err != nil {
				t.Fatalf("%s: %v", k, r.err)
			}
			same[r.a.Status]++
		case "done":
			if r.err != nil || r.a.Status != StatusDuplicate {
				t.Fatalf("%s: %v %v, want duplicate", k, r.a.Status, r.err)
			}
		default:
			if r.err != nil || r.a.Status != StatusAcquired {
				t.Fatalf("%s: %v %v, want acquired", k, r.a.Status, r.err)
			}
		}
	}
	if same[StatusAcquired] != 1 || same[StatusDuplicate] != 1 {
		t.Fatalf("two marks of one key answered %v, want one Acquired and one Duplicate", same)
	}
	runs := g.snapshot()
	if len(runs) < 2 || len(runs) > len(keys)/2 {
		t.Fatalf("%d calls after the held one went in round trips %+v: want them to share a few", len(keys), runs[1:])
	}
}

// A caller whose context ends once its command is on its way gets the command's real
// reply. Reporting a failure instead let the Mark land after the caller had answered
// StoreUnavailable: the message was Nak'ed, and its redelivery (a new token) found
// DONE and was dropped without fn ever running.
func TestCallInARoundTripGetsItsReply(t *testing.T) {
	s, g, prefix := gatedStore(t)
	first := holdFirst(t, s, g, prefix+":first")
	ctx, cancel := context.WithCancel(context.Background())
	type reply struct {
		a   Answer
		err error
	}
	gaveUp := make(chan reply, 1)
	go func() {
		a, err := s.Mark(ctx, prefix+":msg", "T1", "", time.Minute)
		gaveUp <- reply{a, err}
	}()
	time.Sleep(50 * time.Millisecond) // queued behind the held round trip
	g.gate <- struct{}{}              // release the first round trip only
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	<-g.entered // the round trip with msg is on its way
	cancel()
	select {
	case r := <-gaveUp:
		t.Fatalf("returned %v %v while its command was in flight", r.a.Status, r.err)
	case <-time.After(50 * time.Millisecond):
	}
	close(g.gate)
	if r := <-gaveUp; r.err != nil || r.a.Status != StatusAcquired {
		t.Fatalf("got %v %v, want the mark's real answer (acquired)", r.a.Status, r.err)
	}
}

// A call whose context has already ended is not sent.
func TestEndedContextIsNotSent(t *testing.T) {
	s, g, prefix := gatedStore(t)
	close(g.gate)
	ctx, cancel := context.WithCancelCause(context.Background())
	stop := errors.New("caller gave up")
	cancel(stop)
	if _, err := s.Mark(ctx, prefix+":left", "T", "", time.Minute); !errors.Is(err, stop) || !errors.Is(err, ErrStoreUnavailable) {
		t.Fatalf("mark on an ended context: %v, want its cause as a store error", err)
	}
	runs := g.snapshot()
	if n, err := s.c.Exists(context.Background(), prefix+":left").Result(); err != nil || n != 0 || len(runs) != 0 {
		t.Fatalf("the mark was sent (exists %d, %v; round trips %+v)", n, err, runs)
	}
}

// A Lookup of several keys is one pipeline.
func TestLookupOfSeveralKeysIsOneRoundTrip(t *testing.T) {
	s, g, prefix := gatedStore(t)
	close(g.gate)
	ctx := context.Background()
	keys := []string{prefix + ":h:a", prefix + ":h:b", prefix + ":h:c"}
	if err := s.c.Set(ctx, keys[1], encodeRecord(stateDone, "T", ""), time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lookup(ctx, keys[:1]); err != nil { // loads the script (NOSCRIPT, then EVAL)
		t.Fatal(err)
	}
	before := len(g.snapshot())
	recs, err := s.Lookup(ctx, keys)
	if err != nil || recs[0].State != RecordAbsent || recs[1].State != RecordDone || recs[2].State != RecordAbsent {
		t.Fatalf("lookup: %+v %v", recs, err)
	}
	if runs := g.snapshot()[before:]; len(runs) != 1 || runs[0].cmds != 3 {
		t.Fatalf("round trips %+v, want one pipeline of 3", runs)
	}
}

// WithoutAutoPipeline sends each single call as a command of its own, through the
// client; by default concurrent calls share round trips through its AutoPipeline.
func TestWithoutAutoPipeline(t *testing.T) {
	const calls = 10
	for _, c := range []struct {
		name   string
		opts   []RedisOption
		shared bool
	}{{"default", nil, true}, {"WithoutAutoPipeline", []RedisOption{WithoutAutoPipeline()}, false}} {
		t.Run(c.name, func(t *testing.T) {
			s, g, prefix := gatedStore(t, c.opts...)
			first := holdFirst(t, s, g, prefix+":first")
			var wg sync.WaitGroup
			for i := range calls {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, err := s.Mark(context.Background(), fmt.Sprintf("%s:k%d", prefix, i), "T", "", time.Minute); err != nil {
						t.Error(err)
					}
				}()
			}
			time.Sleep(100 * time.Millisecond) // every call is out, or queued
			close(g.gate)
			wg.Wait()
			if err := <-first; err != nil {
				t.Fatal(err)
			}
			runs := g.snapshot()
			for _, r := range runs {
				if !c.shared && (r.cmds != 1 || r.pipeline) {
					t.Fatalf("round trips %+v, want single commands", runs)
				}
			}
			if shared := len(runs) < calls+1; shared != c.shared {
				t.Fatalf("%d calls in %d round trips (%+v): shared %v, want %v", calls+1, len(runs), runs, shared, c.shared)
			}
		})
	}
}

// The client's AutoPipeliner is shared with its other users: if one of them closes
// it, the store's next calls go through the new one the client makes.
func TestAutoPipelinerClosedByAnotherUser(t *testing.T) {
	_, c := newMiniredis(t)
	s, err := NewRedisStore(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := s.Mark(ctx, "p:h:1", "T", "", time.Minute); err != nil {
		t.Fatal(err)
	}
	ap, err := c.AutoPipeline()
	if err != nil {
		t.Fatal(err)
	}
	if err := ap.Close(); err != nil {
		t.Fatal(err)
	}
	if a, err := s.Mark(ctx, "p:h:2", "T", "", time.Minute); err != nil || a.Status != StatusAcquired {
		t.Fatalf("mark after the AutoPipeliner was closed: %+v, %v", a, err)
	}
}

// panicOnce panics in the first non-handshake round trip it sees, single or
// pipeline.
type panicOnce struct{ armed atomic.Bool }

func (p *panicOnce) DialHook(next redis.DialHook) redis.DialHook { return next }
func (p *panicOnce) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !testenv.IsHandshake(cmd) && p.armed.CompareAndSwap(true, false) {
			panic("hook blew up")
		}
		return next(ctx, cmd)
	}
}
func (p *panicOnce) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && !testenv.IsHandshake(cmds[0]) && p.armed.CompareAndSwap(true, false) {
			panic("hook blew up")
		}
		return next(ctx, cmds)
	}
}

// A panic in a round trip (a hook, a driver bug), recovered by a caller up the stack
// (net/http does) or by go-redis, fails that call at most: the store's next calls go
// through.
func TestPanicInARoundTripFailsOnlyItsCall(t *testing.T) {
	_, c := newMiniredis(t)
	h := &panicOnce{}
	c.AddHook(h)
	s, err := NewRedisStore(c)
	if err != nil {
		t.Fatal(err)
	}
	prefix := testenv.Prefix()
	h.armed.Store(true)
	func() {
		defer func() { _ = recover() }()
		_, _ = s.Mark(context.Background(), prefix+":a", "T", "", time.Minute)
	}()
	if h.armed.Load() {
		t.Fatal("the hook did not run")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := range 3 {
		if _, err := s.Mark(ctx, fmt.Sprintf("%s:b%d", prefix, i), "T", "", time.Minute); err != nil {
			t.Fatalf("healthy store, call %d after the panic failed: %v", i, err)
		}
	}
}
