package redisstore

// WaitForRunning waits for a run's end and no longer, and a claim's round trips
// stay what they should.

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// panicOnce panics in the first non-handshake single command it sees.
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
	return next
}

// A panic inside Process on the inline path (a hook, a driver bug) that a caller up
// the stack recovers (net/http does) must give back its round-trip slot: with the
// slot kept, every later call queued behind a flusher that never came.
func TestInlinePanicGivesBackItsSlot(t *testing.T) {
	_, c := testenv.Miniredis(t)
	h := &panicOnce{}
	c.AddHook(h)
	s, err := New(c, WithAutoPipeline(64, 1))
	if err != nil {
		t.Fatal(err)
	}
	prefix := testenv.Prefix()
	h.armed.Store(true)
	func() {
		defer func() { _ = recover() }()
		_, _ = only(s.Mark(context.Background(), entry(prefix+":a", "T", "", time.Minute)))
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := only(s.Mark(ctx, entry(prefix+":b", "T", "", time.Minute))); err != nil {
		t.Fatalf("healthy store, next call failed: %v (outstanding %d)", err, s.pipe.outstanding())
	}
}

// A caller whose context ends once its command is in a round trip gets the command's
// real reply. Reporting a failure instead let the Mark land after the caller had
// answered StoreUnavailable: the message was Nak'ed, and its redelivery (a new token)
// found DONE and was dropped without fn ever running.
func TestCallInARoundTripGetsItsReply(t *testing.T) {
	s, g, prefix := pipelinedStore(t, 64, 1)
	first := make(chan error, 1)
	go func() { // holds the only slot at the gate
		_, err := only(s.Mark(context.Background(), entry(prefix+":first", "T", "", time.Minute)))
		first <- err
	}()
	<-g.entered
	ctx, cancel := context.WithCancel(context.Background())
	type reply struct {
		a   driver.Answer
		err error
	}
	gaveUp := make(chan reply, 1)
	go func() {
		a, err := only(s.Mark(ctx, entry(prefix+":msg", "T1", "", time.Minute)))
		gaveUp <- reply{a, err}
	}()
	other := make(chan error, 1)
	go func() {
		_, err := only(s.Mark(context.Background(), entry(prefix+":other", "T", "", time.Minute)))
		other <- err
	}()
	waitQueued(t, s.pipe, 2)
	g.gate <- struct{}{} // release the first round trip only
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	<-g.entered // the pipeline [msg, other] is on its way
	cancel()
	select {
	case r := <-gaveUp:
		t.Fatalf("returned %v %v while its command was in flight", r.a.Status, r.err)
	case <-time.After(50 * time.Millisecond):
	}
	close(g.gate)
	if r := <-gaveUp; r.err != nil || r.a.Status != driver.StatusAcquired {
		t.Fatalf("got %v %v, want the mark's real answer (acquired)", r.a.Status, r.err)
	}
	if err := <-other; err != nil {
		t.Fatal(err)
	}
}
