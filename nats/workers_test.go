package nats

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// goid is the calling goroutine's id, from its stack's first line.
func goid() uint64 {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	f := bytes.Fields(buf) // "goroutine", "<id>", "[running]:", ...
	id, _ := strconv.ParseUint(string(f[1]), 10, 64)
	return id
}

// alive reports whether the goroutine id still exists.
func alive(id uint64) bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return bytes.Contains(buf, []byte(fmt.Sprintf("goroutine %d [", id)))
}

// Handler's batches run on goroutines kept between batches, so that a batch does
// not grow a new goroutine's stack in the store client (the bench's JetStream
// filter variant spent 0.3 µs a message on it). Each message here is a batch of
// its own, delivered once the worker of the one before waits: all run on the same
// goroutine. An idle worker ends when the Handler's context does.
func TestBatchesRunOnTheSameWorker(t *testing.T) {
	h := registerMem(t, "workers", dedup.ModeDo)
	cfg, err := newConfig(h, []Option{WithConcurrency(16)})
	if err != nil {
		t.Fatal(err)
	}
	j := &JetStream{adapter{h: h, cfg: cfg}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	parked := make(chan struct{}, 16)
	hook := func(done <-chan struct{}) {
		if done == ctx.Done() {
			parked <- struct{}{}
		}
	}
	parkedHook.Store(&hook)
	defer parkedHook.Store(nil)
	was := idleWorker.Swap(int64(time.Minute)) // a slow machine does not end the worker
	defer idleWorker.Store(was)
	ran := make(chan uint64, 16)
	handler := j.Handler(ctx, func(context.Context, *Msg) error {
		ran <- goid()
		return nil
	})
	var ids []uint64
	for i := range 5 {
		m := newFake(fmt.Sprint("w-", i), "payload", 1)
		handler(m)
		ids = append(ids, <-ran)
		select {
		case <-parked:
		case <-time.After(5 * time.Second):
			t.Fatalf("message %d: no worker waited for the next batch", i)
		}
		if got := m.got(); len(got) != 1 || got[0] != "ack" {
			t.Fatalf("message %d: acks %v, want one ack", i, got)
		}
	}
	for i, id := range ids {
		if id != ids[0] {
			t.Fatalf("batch %d ran on goroutine %d, batch 0 on %d: want one worker (%v)", i, id, ids[0], ids)
		}
	}
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for alive(ids[0]) {
		if time.Now().After(deadline) {
			t.Fatal("the idle worker outlived its Handler's context")
		}
		time.Sleep(10 * time.Millisecond)
	}
	j.Wait()
}

// A worker with no batch for idleWorker (100 ms) ends, whether or not the context does.
func TestAnIdleWorkerEnds(t *testing.T) {
	h := registerMem(t, "idle", dedup.ModeDo) // a batch of one runs fn on its worker
	cfg, err := newConfig(h, []Option{WithConcurrency(16)})
	if err != nil {
		t.Fatal(err)
	}
	j := &JetStream{adapter{h: h, cfg: cfg}}
	ran := make(chan uint64, 1)
	handler := j.Handler(context.Background(), func(context.Context, *Msg) error {
		ran <- goid()
		return nil
	})
	handler(newFake("i-1", "payload", 1))
	id := <-ran
	j.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for alive(id) {
		if time.Now().After(deadline) {
			t.Fatalf("the worker was still there 5 s after its batch, want it gone after %v", time.Duration(idleWorker.Load()))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// registerMem registers a handler of mode on a Deduper over a memory store.
func registerMem(t *testing.T, name string, mode dedup.Mode) *dedup.Handler {
	t.Helper()
	h, err := newDeduper(t, memStore(t)).Register(name, dedup.WithMode(mode))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// Many starts while the Handler's context ends and workers park and leave: start
// never blocks (it did, holding the workers' lock, once more workers had been told
// to drain than the wake channel holds), every drain handed out runs, and every
// worker ends.
func TestWorkersStartWhileTheContextEnds(t *testing.T) {
	for round := range 50 {
		done := make(chan struct{})
		var ran sync.WaitGroup
		w := &workers{wake: make(chan struct{}, batchesInFlight), done: done}
		w.drain = func() { ran.Done() }
		var starters sync.WaitGroup
		for g := range 6 {
			starters.Go(func() {
				for i := range 60 {
					if g == 0 && i == 30 {
						close(done)
					}
					ran.Add(1)
					w.start()
				}
			})
		}
		finished := make(chan struct{})
		go func() { starters.Wait(); ran.Wait(); close(finished) }()
		select {
		case <-finished:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: a start or a drain never ended", round)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			w.mu.Lock()
			idle := w.idle
			w.mu.Unlock()
			if idle == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d workers still parked after their context ended", round, idle)
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// Messages handed to a Handler whose context has ended are Cancelled: left without an
// acknowledgement, for redelivery after AckWait. Once they still come lateWarning
// after the first, one warning per Handler says so (a new user's trial saw 992 such
// deliveries over 2 s and no log line), without a key; a shutdown's last deliveries,
// sooner, do not.
func TestAHandlerWhoseContextEndedSaysSoOnce(t *testing.T) {
	for _, conc := range []int{1, 16} {
		t.Run(fmt.Sprint("concurrency ", conc), func(t *testing.T) {
			h := registerMem(t, "ended", dedup.ModeDo)
			logs := &testenv.LogBuffer{}
			cfg, err := newConfig(h, []Option{WithConcurrency(conc), WithLogger(slog.New(slog.NewTextHandler(logs, nil)))})
			if err != nil {
				t.Fatal(err)
			}
			j := &JetStream{adapter{h: h, cfg: cfg}}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			ran := false
			handler := j.Handler(ctx, func(context.Context, *Msg) error { ran = true; return nil })
			msgs := []*fakeMsg{newFake("order-1", "a", 1), newFake("order-2", "a", 1), newFake("order-3", "a", 1), newFake("order-4", "a", 1)}
			handler(msgs[0])
			handler(msgs[1])
			j.Wait()
			if out := logs.String(); strings.Contains(out, "still delivers") {
				t.Fatalf("a warning for a shutdown's last deliveries: %q", out)
			}
			time.Sleep(lateWarning)
			handler(msgs[2])
			handler(msgs[3])
			j.Wait()
			for _, m := range msgs {
				if got := m.got(); len(got) != 0 {
					t.Fatalf("acks %v, want none", got)
				}
			}
			out := logs.String()
			if n := strings.Count(out, "still delivers"); n != 1 || ran || strings.Contains(out, "order-") {
				t.Fatalf("%d warnings (want 1), fn ran %v, log %q", n, ran, out)
			}
		})
	}
}
