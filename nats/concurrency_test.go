package nats

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// handlerJS makes a new stream, a consumer name on it whose AckWait (10s) is well
// above any run here, and an adapter over it for a new handler name in mode on store.
func handlerJS(t *testing.T, e *env, name string, store driver.Store, mode dedup.Mode, opts ...Option) (jetstream.Consumer, *JetStream) {
	t.Helper()
	e.newStream()
	c := e.consumer(name, func(cc *jetstream.ConsumerConfig) { cc.AckWait = 10 * time.Second })
	return c, newJS(t, register(t, newDeduper(t, store), name, dedup.WithMode(mode)), c, opts...)
}

// forModes runs f for a ModeDo and a ModeFilter handler: Handler takes a path of its
// own for each (one message at a time through the store, or batches).
func forModes(t *testing.T, f func(t *testing.T, mode dedup.Mode)) {
	for _, m := range []struct {
		name string
		mode dedup.Mode
	}{{"do", dedup.ModeDo}, {"filter", dedup.ModeFilter}} {
		t.Run(m.name, func(t *testing.T) { f(t, m.mode) })
	}
}

// Consume's handler runs up to WithConcurrency messages at once: n handlers meet at a
// barrier that a one-at-a-time handler could never pass, and every message is then
// acknowledged once.
func TestHandlerRunsMessagesConcurrently(t *testing.T) {
	const n = 8
	forModes(t, func(t *testing.T, mode dedup.Mode) {
		eachServer(t, func(t *testing.T, e *env) {
			c, j := handlerJS(t, e, "orders", memStore(t), mode, WithConcurrency(n))
			var inside, most atomic.Int32
			barrier := make(chan struct{})
			var once sync.Once
			consume(t, c, j.Handler(context.Background(), func(ctx context.Context, m *Msg) error {
				now := inside.Add(1)
				defer inside.Add(-1)
				for {
					if old := most.Load(); now <= old || most.CompareAndSwap(old, now) {
						break
					}
				}
				if now == n {
					once.Do(func() { close(barrier) })
				}
				select {
				case <-barrier:
					return nil
				case <-time.After(5 * time.Second):
					return errors.New("the other handlers never arrived")
				}
			}))
			var last *jetstream.PubAck
			for i := range n {
				last = e.publish("new", fmt.Sprint("order-", i), "x")
			}
			e.settled(c, last.Sequence)
			j.Wait()
			if got := most.Load(); got != n {
				t.Fatalf("at most %d handlers ran at once, want %d", got, n)
			}
			if s := j.Stats(); s.Count(ActAck) != n {
				t.Fatalf("actions %+v, want %d acks", s, n)
			}
		})
	})
}

// WithConcurrency(1) runs messages one at a time, in delivery order.
func TestHandlerConcurrencyOneKeepsOrder(t *testing.T) {
	const n = 30
	forModes(t, func(t *testing.T, mode dedup.Mode) {
		eachServer(t, func(t *testing.T, e *env) {
			c, j := handlerJS(t, e, "orders", memStore(t), mode, WithConcurrency(1))
			var mu sync.Mutex
			var seen []uint64
			var inside atomic.Int32
			consume(t, c, j.Handler(context.Background(), func(ctx context.Context, m *Msg) error {
				if inside.Add(1) != 1 {
					t.Error("two handlers ran at once")
				}
				defer inside.Add(-1)
				time.Sleep(time.Millisecond) // give a second message the chance to overlap
				mu.Lock()
				seen = append(seen, m.Metadata().Sequence.Stream)
				mu.Unlock()
				return nil
			}))
			var last *jetstream.PubAck
			for i := range n {
				last = e.publish("new", fmt.Sprint("order-", i), "x")
			}
			e.settled(c, last.Sequence)
			j.Wait()
			mu.Lock()
			defer mu.Unlock()
			if len(seen) != n {
				t.Fatalf("%d messages handled, want %d", len(seen), n)
			}
			for i := 1; i < n; i++ {
				if seen[i] <= seen[i-1] {
					t.Fatalf("handled out of order: %v", seen)
				}
			}
		})
	})
}

// Wait returns only once every message handed to the Handler has been acknowledged.
func TestWaitReturnsOnceEveryMessageInHandIsAcknowledged(t *testing.T) {
	forModes(t, func(t *testing.T, mode dedup.Mode) {
		eachServer(t, func(t *testing.T, e *env) {
			c, j := handlerJS(t, e, "orders", memStore(t), mode)
			started := make(chan struct{})
			release := make(chan struct{})
			cc := consume(t, c, j.Handler(context.Background(), func(ctx context.Context, m *Msg) error {
				close(started)
				<-release
				return nil
			}))
			free := sync.OnceFunc(func() { close(release) })
			t.Cleanup(free) // runs first: a failing test must not leave the handler blocked
			e.publish("new", "order-1", "x")
			<-started
			stopConsume(t, cc)
			waited := make(chan struct{})
			go func() { j.Wait(); close(waited) }()
			select {
			case <-waited:
				t.Fatal("Wait returned while a handler was running")
			case <-time.After(50 * time.Millisecond):
			}
			free()
			<-waited
			if s := j.Stats(); s.Count(ActAck) != 1 {
				t.Fatalf("actions %+v after Wait, want the ack", s)
			}
		})
	})
}

func TestWithConcurrencyOutsideOneToMaxIsInvalid(t *testing.T) {
	h := register(t, newDeduper(t, memStore(t)), "orders")
	for _, n := range []int{0, -1, MaxConcurrency + 1} {
		if _, err := NewCore(h, WithConcurrency(n)); !errors.Is(err, dedup.ErrInvalidOption) {
			t.Fatalf("WithConcurrency(%d): %v, want ErrInvalidOption", n, err)
		}
	}
	if _, err := NewCore(h, WithConcurrency(1)); err != nil {
		t.Fatal(err)
	}
}

// checkCounter counts a store's checks (Mark and Claim calls), the entries they
// carry, and its completions (Complete calls); each check takes delay, as a round
// trip would, so that messages queue behind it.
type checkCounter struct {
	driver.Store
	delay                   time.Duration
	checks, checked, finals atomic.Int64
}

func (s *checkCounter) Mark(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	s.check(entries)
	return s.Store.Mark(ctx, entries)
}

func (s *checkCounter) Claim(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	s.check(entries)
	return s.Store.Claim(ctx, entries)
}

func (s *checkCounter) check(entries []driver.Entry) {
	s.checks.Add(1)
	s.checked.Add(int64(len(entries)))
	time.Sleep(s.delay)
}

func (s *checkCounter) Complete(ctx context.Context, entries []driver.Entry) ([]error, error) {
	s.finals.Add(1)
	return s.Store.Complete(ctx, entries)
}

// Handler checks the messages that arrive while earlier checks are out as batches
// (a Mark, or a Claim and then Completes, of several entries), never one by one: 300
// messages in a handful of round trips, each acknowledged once and run once.
func TestHandlerBatchesChecks(t *testing.T) {
	const n = 300
	forModes(t, func(t *testing.T, mode dedup.Mode) {
		eachServer(t, func(t *testing.T, e *env) {
			testHandlerBatchesChecks(t, e, mode, n)
		})
	})
}

func testHandlerBatchesChecks(t *testing.T, e *env, mode dedup.Mode, n int) {
	store := &checkCounter{Store: memStore(t), delay: 20 * time.Millisecond}
	c, j := handlerJS(t, e, "metrics", store, mode)
	var last *jetstream.PubAck
	for i := range n {
		last = e.publish("new", fmt.Sprint("m-", i), "x")
	}
	var mu sync.Mutex
	runs := map[string]int{}
	consume(t, c, j.Handler(context.Background(), func(ctx context.Context, m *Msg) error {
		mu.Lock()
		runs[m.Header(jetstream.MsgIDHeader)]++
		mu.Unlock()
		return nil
	}))
	e.settled(c, last.Sequence)
	j.Wait()
	if s := j.Stats(); s.Count(ActAck) != uint64(n) {
		t.Fatalf("actions %+v, want %d acks", s, n)
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		if r := runs[fmt.Sprint("m-", i)]; r != 1 {
			t.Errorf("m-%d ran %d times, want once", i, r)
		}
	}
	// the store takes one call whatever a batch's size: one by one would be a check
	// per message, batches at most n/6 checks
	checks, checked, finals := store.checks.Load(), store.checked.Load(), store.finals.Load()
	t.Logf("%d messages: %d checks of %d entries, %d Completes", n, checks, checked, finals)
	if checks == 0 || checks > int64(n/6) {
		t.Fatalf("%d checks of %d entries for %d messages; want batches (at most %d checks)", checks, checked, n, n/6)
	}
	if (mode == dedup.ModeDo) != (finals > 0) {
		t.Fatalf("%d Complete calls in mode %v", finals, mode)
	}
}

// In a batch, a message is acknowledged, and its slot freed, as soon as its own result
// is final: four fast messages are acked (in ModeDo, their claims completed) while
// the fifth, slow one of the same batch still runs.
func TestBatchAcksEachMessageWhenDone(t *testing.T) {
	forModes(t, func(t *testing.T, mode dedup.Mode) {
		eachServer(t, func(t *testing.T, e *env) { testBatchAcksEachMessageWhenDone(t, e, mode) })
	})
}

func testBatchAcksEachMessageWhenDone(t *testing.T, e *env, mode dedup.Mode) {
	c, j := handlerJS(t, e, "metrics", memStore(t), mode)
	var last *jetstream.PubAck
	for i := range 5 {
		last = e.publish("new", fmt.Sprint("m-", i), "x")
	}
	batch, err := c.Fetch(5, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	if len(msgs) != 5 {
		t.Fatalf("fetched %d messages, want 5", len(msgs))
	}
	release := make(chan struct{})
	free := sync.OnceFunc(func() { close(release) })
	t.Cleanup(free)
	var freed atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		j.handleMsgs(context.Background(), msgs, 5, func(ctx context.Context, m *Msg) error {
			if m.Header(jetstream.MsgIDHeader) == "m-0" {
				<-release
			}
			return nil
		}, func(int) { freed.Add(1) })
	}()
	testenv.Eventually(t, 10*time.Second, "the four fast messages acked and freed", func() bool {
		return j.Stats().Count(ActAck) == 4 && freed.Load() == 4
	})
	free()
	<-done
	e.settled(c, last.Sequence)
	if s := j.Stats(); s.Count(ActAck) != 5 || freed.Load() != 5 {
		t.Fatalf("actions %+v, %d freed; want 5 acks, 5 freed", s, freed.Load())
	}
}

// A batching Handler's fn that panics or ends its goroutine (runtime.Goexit) costs
// its own message a Nak and nothing else: the others are acked, no slot is lost (the
// consumer goes on), and Wait returns. In ModeDo the claim is given back, so the
// redelivery runs at once (an InProgress would be a NakWithDelay more). At
// concurrency 1 the fn does not run on the client library's goroutine, so a Goexit
// does not stop the consumer either.
func TestHandlerPanicOrGoexitCostsOnlyItsOwnMessageANak(t *testing.T) {
	forModes(t, func(t *testing.T, mode dedup.Mode) {
		for _, conc := range []int{1, 2} { // 1: one at a time, not in batches
			t.Run(fmt.Sprint("concurrency-", conc), func(t *testing.T) {
				eachServer(t, func(t *testing.T, e *env) { testHandlerPanicAndGoexit(t, e, mode, conc) })
			})
		}
	})
}

func testHandlerPanicAndGoexit(t *testing.T, e *env, mode dedup.Mode, conc int) {
	c, j := handlerJS(t, e, "metrics", memStore(t), mode, WithConcurrency(conc)) // a lost slot would soon stop it
	var last *jetstream.PubAck
	for i := range 20 {
		last = e.publish("new", fmt.Sprint("m-", i), "x")
	}
	consume(t, c, j.Handler(context.Background(), func(ctx context.Context, m *Msg) error {
		if m.Metadata().NumDelivered == 1 {
			switch m.Header(jetstream.MsgIDHeader) {
			case "m-3":
				panic("boom")
			case "m-7", "m-8":
				runtime.Goexit()
			}
		}
		return nil
	}))
	e.settled(c, last.Sequence)
	j.Wait()
	s := j.Stats()
	if s.Count(ActNak) != 3 {
		t.Fatalf("actions %+v, want 3 Naks (a panic, two Goexits)", s)
	}
	// a Nak'ed filter message was marked: its redelivery is a duplicate, acked
	if s.Count(ActAck) != 20 {
		t.Fatalf("actions %+v, want 20 acks", s)
	}
}
