package redisstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/internal/storekit"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// gateHook holds every round trip until the gate opens, and records each one: how
// many commands it carried and whether it ran on a caller's own context.
type gateHook struct {
	gate chan struct{}
	mu   sync.Mutex
	runs []gateRun
	// entered receives once per round trip, before it waits at the gate
	entered chan struct{}
}

type gateRun struct {
	cmds   int
	inline bool // sent on the goroutine of the caller that marked its context
}

// goid returns the current goroutine's id, read from its stack header.
func goid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	id, _ := strconv.ParseUint(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return id
}

type callerKey struct{}

func newGateHook() *gateHook {
	return &gateHook{gate: make(chan struct{}), entered: make(chan struct{}, 1024)}
}

func (g *gateHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if testenv.IsHandshake(cmd) {
			return next(ctx, cmd)
		}
		g.record(ctx, 1)
		return next(ctx, cmd)
	}
}

func (g *gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && testenv.IsHandshake(cmds[0]) {
			return next(ctx, cmds)
		}
		g.record(ctx, len(cmds))
		return next(ctx, cmds)
	}
}

func (g *gateHook) record(ctx context.Context, n int) {
	g.mu.Lock()
	id, _ := ctx.Value(callerKey{}).(uint64)
	g.runs = append(g.runs, gateRun{cmds: n, inline: id != 0 && id == goid()})
	g.mu.Unlock()
	g.entered <- struct{}{}
	<-g.gate
}

func (g *gateHook) snapshot() []gateRun {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]gateRun(nil), g.runs...)
}

func pipelinedStore(t *testing.T, batch, inFlight int) (*Store, *gateHook, string) {
	t.Helper()
	_, c := testenv.Miniredis(t)
	g := newGateHook()
	c.AddHook(g)
	s, err := New(c, WithAutoPipeline(batch, inFlight))
	if err != nil {
		t.Fatal(err)
	}
	return s, g, testenv.Prefix()
}

func (p *autoPipe) queued() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue)
}

func (p *autoPipe) outstanding() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.flushers
}

// waitQueued waits until n calls are queued behind the busy round trips.
func waitQueued(t *testing.T, p *autoPipe, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for p.queued() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued, want %d", p.queued(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// A lone caller sends its command itself, at once, on its own context: no handoff
// to another goroutine and no timer between the call and the round trip.
func TestAutoPipelineLoneCallGoesOutInline(t *testing.T) {
	s, g, prefix := pipelinedStore(t, 64, 4)
	close(g.gate)
	ctx := context.WithValue(context.Background(), callerKey{}, goid())
	for i := range 5 {
		a, err := only(s.Mark(ctx, entry(fmt.Sprintf("%s:k%d", prefix, i), "T", "", time.Minute)))
		if err != nil || a.Status != driver.StatusAcquired {
			t.Fatalf("mark %d: %v %v", i, a.Status, err)
		}
	}
	runs := g.snapshot()
	if len(runs) != 5 {
		t.Fatalf("%d round trips for 5 sequential calls, want 5", len(runs))
	}
	for i, r := range runs {
		if r.cmds != 1 || !r.inline {
			t.Fatalf("round trip %d: %+v, want 1 command sent inline", i, r)
		}
	}
	if n := s.pipe.outstanding(); n != 0 {
		t.Fatalf("%d round trips still counted outstanding", n)
	}
}

// Calls that arrive while every round-trip slot is busy queue up, and go out as
// pipelines of at most batch commands as soon as a slot frees.
func TestAutoPipelineCoalescesQueuedCalls(t *testing.T) {
	const batch, queued = 8, 20
	s, g, prefix := pipelinedStore(t, batch, 1)
	ctx := context.Background()
	var wg sync.WaitGroup
	answers := make([]driver.Answer, queued+1)
	errs := make([]error, queued+1)
	call := func(i int) {
		defer wg.Done()
		answers[i], errs[i] = only(s.Mark(ctx, entry(fmt.Sprintf("%s:k%d", prefix, i%queued), fmt.Sprint("T", i), "", time.Minute)))
	}
	wg.Add(1)
	go call(queued) // the same key as call 0: its answer is decided by order
	<-g.entered     // the one slot is busy at the gate
	for i := range queued {
		wg.Add(1)
		go call(i)
	}
	waitQueued(t, s.pipe, queued)
	close(g.gate)
	wg.Wait()

	runs := g.snapshot()
	want := []int{1, batch, batch, queued - 2*batch}
	if len(runs) != len(want) {
		t.Fatalf("round trips %+v, want sizes %v", runs, want)
	}
	for i, r := range runs {
		if r.cmds != want[i] {
			t.Fatalf("round trips %+v, want sizes %v", runs, want)
		}
	}
	for i := range queued + 1 {
		wantSt := driver.StatusAcquired
		if i == 0 {
			wantSt = driver.StatusDuplicate // call queued marked key 0 first
		}
		if errs[i] != nil || answers[i].Status != wantSt {
			t.Fatalf("call %d: %v %v, want %v", i, answers[i].Status, errs[i], wantSt)
		}
	}
	if n := s.pipe.outstanding(); n != 0 {
		t.Fatalf("%d round trips still counted outstanding", n)
	}
}

// Each queued call gets its own command's reply, error replies included.
func TestAutoPipelineRepliesReachTheirCallers(t *testing.T) {
	m, c := testenv.Miniredis(t)
	g := newGateHook()
	c.AddHook(g)
	s, err := New(c, WithAutoPipeline(64, 1))
	if err != nil {
		t.Fatal(err)
	}
	prefix := testenv.Prefix()
	if _, err := m.Lpush(prefix+":list", "x"); err != nil {
		t.Fatal(err)
	}
	m.Set(prefix+":done", storekit.Encode(storekit.StateDone, "other", ""))
	ctx := context.Background()
	first := make(chan error, 1)
	go func() {
		_, err := only(s.Mark(ctx, entry(prefix+":first", "T", "", time.Minute)))
		first <- err
	}()
	<-g.entered
	type reply struct {
		a   driver.Answer
		err error
	}
	keys := []string{"list", "done", "new1", "new2"}
	replies := make([]chan reply, len(keys))
	for i, k := range keys {
		replies[i] = make(chan reply, 1)
		go func() {
			a, err := only(s.Mark(ctx, entry(prefix+":"+k, "T", "", time.Minute)))
			replies[i] <- reply{a, err}
		}()
	}
	waitQueued(t, s.pipe, len(keys))
	close(g.gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		r := <-replies[i]
		switch k {
		case "list":
			if !errors.Is(r.err, driver.ErrStoreUnavailable) {
				t.Fatalf("%s: %v %v, want a WRONGTYPE store error", k, r.a.Status, r.err)
			}
		case "done":
			if r.err != nil || r.a.Status != driver.StatusDuplicate {
				t.Fatalf("%s: %v %v, want duplicate", k, r.a.Status, r.err)
			}
		default:
			if r.err != nil || r.a.Status != driver.StatusAcquired {
				t.Fatalf("%s: %v %v, want acquired", k, r.a.Status, r.err)
			}
		}
	}
	if runs := g.snapshot(); len(runs) != 2 || runs[1].cmds != len(keys) {
		t.Fatalf("round trips %+v, want the queued calls in one pipeline", runs)
	}
}

// A queued caller whose context ends returns at once with its cause, and its
// command is not sent once the slot frees.
func TestAutoPipelineQueuedCallerLeavesOnContext(t *testing.T) {
	s, g, prefix := pipelinedStore(t, 64, 1)
	first := make(chan error, 1)
	go func() {
		_, err := only(s.Mark(context.Background(), entry(prefix+":first", "T", "", time.Minute)))
		first <- err
	}()
	<-g.entered
	ctx, cancel := context.WithCancelCause(context.Background())
	left := make(chan error, 1)
	go func() {
		_, err := only(s.Mark(ctx, entry(prefix+":left", "T", "", time.Minute)))
		left <- err
	}()
	waitQueued(t, s.pipe, 1)
	stop := errors.New("caller gave up")
	cancel(stop)
	if err := <-left; !errors.Is(err, stop) || !errors.Is(err, driver.ErrStoreUnavailable) {
		t.Fatalf("queued caller returned %v, want its context's cause as a store error", err)
	}
	close(g.gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	// the slot is free again: a new call goes out alone, and the abandoned one never did
	if _, err := only(s.Mark(context.Background(), entry(prefix+":after", "T", "", time.Minute))); err != nil {
		t.Fatal(err)
	}
	if runs := g.snapshot(); len(runs) != 2 || runs[0].cmds != 1 || runs[1].cmds != 1 {
		t.Fatalf("round trips %+v, want two single commands", runs)
	}
	if n, err := s.c.Exists(context.Background(), prefix+":left").Result(); err != nil || n != 0 {
		t.Fatalf("the abandoned mark was sent (exists %d, %v)", n, err)
	}
}

// A Lookup of several keys goes out as one pipeline when a round trip is free, and
// queued behind a busy one, its commands go together with other callers' in the
// next; a queued Lookup whose context ends leaves with its cause, unsent.
func TestAutoPipelineLookupOfSeveralKeys(t *testing.T) {
	s, g, prefix := pipelinedStore(t, 64, 1)
	ctx := context.Background()
	keys := []string{prefix + ":h:a", prefix + ":h:b", prefix + ":h:c"}
	close(g.gate) // let the lone Lookup through at once
	if _, err := s.c.Set(ctx, keys[1], storekit.Encode(storekit.StateDone, "T", ""), time.Minute).Result(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lookup(ctx, keys[:1]); err != nil { // loads the script (NOSCRIPT, then EVAL)
		t.Fatal(err)
	}
	before := len(g.snapshot())
	recs, err := s.Lookup(ctx, keys)
	if err != nil || recs[0].State != driver.RecordAbsent || recs[1].State != driver.RecordDone || recs[2].State != driver.RecordAbsent {
		t.Fatalf("lookup: %+v %v", recs, err)
	}
	if runs := g.snapshot()[before:]; len(runs) != 1 || runs[0].cmds != 3 {
		t.Fatalf("round trips %+v, want one pipeline of 3", runs)
	}

	g2 := newGateHook()
	s.c.AddHook(g2)
	first := make(chan error, 1)
	go func() {
		_, err := only(s.Mark(ctx, entry(prefix+":first", "T", "", time.Minute)))
		first <- err
	}()
	<-g2.entered
	type lookup struct {
		recs []driver.Record
		err  error
	}
	got := make(chan lookup, 1)
	go func() {
		recs, err := s.Lookup(ctx, keys)
		got <- lookup{recs, err}
	}()
	waitQueued(t, s.pipe, 3)
	cctx, cancel := context.WithCancelCause(ctx)
	left := make(chan []driver.Record, 1)
	go func() {
		recs, _ := s.Lookup(cctx, []string{keys[0], keys[2]})
		left <- recs
	}()
	waitQueued(t, s.pipe, 5)
	stop := errors.New("caller gave up")
	cancel(stop)
	for _, r := range <-left {
		if !errors.Is(r.Err, stop) {
			t.Fatalf("abandoned lookup: %+v, want its context's cause", r)
		}
	}
	go func() { _, _ = only(s.Mark(ctx, entry(prefix+":second", "T", "", time.Minute))) }()
	waitQueued(t, s.pipe, 4)
	close(g2.gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	l := <-got
	if l.err != nil || l.recs[1].State != driver.RecordDone || l.recs[0].State != driver.RecordAbsent {
		t.Fatalf("queued lookup: %+v %v", l.recs, l.err)
	}
	runs := g2.snapshot()
	if len(runs) != 2 || runs[1].cmds != 4 {
		t.Fatalf("round trips %+v, want the first mark, then the queued lookup's 3 and a mark's 1 together", runs)
	}
}

func TestAutoPipelineOptions(t *testing.T) {
	_, c := testenv.Miniredis(t)
	for _, o := range []Option{WithAutoPipeline(0, 1), WithAutoPipeline(10001, 1), WithAutoPipeline(1, 0), WithAutoPipeline(1, 1025)} {
		if _, err := New(c, o); !errors.Is(err, driver.ErrInvalidOption) {
			t.Fatalf("got %v, want driver.ErrInvalidOption", err)
		}
	}
	s, err := New(c, WithoutAutoPipeline())
	if err != nil || s.pipe != nil {
		t.Fatalf("WithoutAutoPipeline: %v, pipe %v", err, s.pipe)
	}
	if s, _ := New(c); s.pipe == nil || s.pipe.batch != DefaultPipelineBatch || s.pipe.inFlight != DefaultPipelinesInFlight {
		t.Fatal("auto-pipelining is not on by default")
	}
}
