package nats

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/internal/testenv"
	"github.com/dedupkit/dedupkit/keys"
)

// Each test here is one row of the outcome → ack table (docs/design.md §5), observed on the
// server: what the consumer says was delivered, redelivered and left pending. The
// adapter counts an action once its call returns, after the server has it: the tests
// read its Stats after Wait, once the server has nothing more to deliver.

func TestProcessedIsAckedAndNotRedelivered(t *testing.T) {
	eachServer(t, func(t *testing.T, e *env) {
		e.newStream()
		c := e.consumer("orders")
		h := register(t, newDeduper(t, memStore(t)), "orders")
		j := newJS(t, h, c)
		var r runs
		consume(t, c, j.Handler(context.Background(), func(_ context.Context, m *Msg) error { r.add(m); return nil }))

		ack := e.publish("new", "order-1", "one")
		e.settled(c, ack.Sequence)
		e.quietFor(c, 2*testAckWait, 1)
		j.Wait()
		if n := r.of("order-1"); n != 1 {
			t.Fatalf("handler ran %d times, want 1", n)
		}
		if s := j.Stats(); s.Count(ActAck) != 1 || s.Count(ActNone)+s.Count(ActNak)+s.Count(ActNakWithDelay)+s.Count(ActTerm) != 0 {
			t.Fatalf("actions: %+v", s)
		}
	})
}

func TestDuplicateIsAckedWithoutRunning(t *testing.T) {
	eachServer(t, func(t *testing.T, e *env) {
		e.newStream()
		c := e.consumer("orders")
		h := register(t, newDeduper(t, memStore(t)), "orders")
		j := newJS(t, h, c)
		var r runs
		consume(t, c, j.Handler(context.Background(), func(_ context.Context, m *Msg) error { r.add(m); return nil }))

		first := e.publish("new", "order-1", "one")
		e.settled(c, first.Sequence)
		// the same Nats-Msg-Id after the stream's duplicate window: a second stored message
		again := e.republish("new", "order-1", "one")
		if again.Sequence == first.Sequence {
			t.Fatal("the stream did not store the republished message")
		}
		e.settled(c, again.Sequence)
		e.quietFor(c, 2*testAckWait, 2)
		j.Wait()
		if n := r.of("order-1"); n != 1 {
			t.Fatalf("handler ran %d times, want 1", n)
		}
		if got := j.Stats().Count(ActAck); got != 2 {
			t.Fatalf("%d acks, want 2", got)
		}
		if got := h.Stats().Count(dedup.Duplicate); got != 1 {
			t.Fatalf("%d duplicates, want 1", got)
		}
	})
}

// Another owner (a second Deduper over the same store: another process) holds the key.
// The adapter naks with a delay until that owner is done, then acks the message as a
// duplicate without ever running its own handler.
func TestInProgressElsewhereNaksThenAcksAsDuplicate(t *testing.T) {
	eachServer(t, func(t *testing.T, e *env) {
		e.newStream()
		c := e.consumer("orders")
		mem := memStore(t)
		h := register(t, newDeduper(t, mem), "orders")
		other := register(t, newDeduper(t, mem), "orders", dedup.WithLease(300*time.Millisecond))

		started, release, otherDone := make(chan struct{}), make(chan struct{}), make(chan dedup.Result, 1)
		go func() {
			res, _ := other.Do(context.Background(), "order-1", func(ctx context.Context) error {
				close(started)
				select {
				case <-release:
					return nil
				case <-ctx.Done(): // the test failed: its Deduper is closing
					return ctx.Err()
				}
			})
			otherDone <- res
		}()
		<-started

		j := newJS(t, h, c)
		var r runs
		consume(t, c, j.Handler(context.Background(), func(_ context.Context, m *Msg) error { r.add(m); return nil }))
		ack := e.publish("new", "order-1", "one")

		// the message comes back after the nak's delay, and is nakked again
		testenv.Eventually(t, 10*time.Second, "two naks while the other owner runs", func() bool {
			return j.Stats().Count(ActNakWithDelay) >= 2
		})
		if ci := e.info(c); ci.Delivered.Consumer < 2 || ci.NumAckPending != 1 {
			t.Fatalf("server: delivered %d, pending %d; want ≥ 2 deliveries, 1 pending", ci.Delivered.Consumer, ci.NumAckPending)
		}
		close(release)
		if res := <-otherDone; res.Outcome != dedup.Processed {
			t.Fatalf("other owner: %v", res.Outcome)
		}
		ci := e.settled(c, ack.Sequence)
		e.quietFor(c, 2*testAckWait, ci.Delivered.Consumer)
		j.Wait()
		if n := r.n.Load(); n != 0 {
			t.Fatalf("handler ran %d times, want 0 (the other owner did the work)", n)
		}
		s := j.Stats()
		if s.Count(ActAck) != 1 || s.Count(ActNakWithDelay) < 2 || s.Count(ActTerm) != 0 {
			t.Fatalf("actions: ack %d, nak-with-delay %d, term %d", s.Count(ActAck), s.Count(ActNakWithDelay), s.Count(ActTerm))
		}
		if hs := h.Stats(); hs.Count(dedup.Duplicate) != 1 || hs.Count(dedup.InProgress) < 2 {
			t.Fatalf("dedup: %d duplicates, %d in progress", hs.Count(dedup.Duplicate), hs.Count(dedup.InProgress))
		}
	})
}

// A failing handler releases its claim (the next delivery runs it: the claim's 30s
// lease would otherwise answer InProgress) and naks with the backoff for its delivery;
// the server redelivers no sooner than that, and the message is processed once.
func TestHandlerErrorNaksWithBackoffThenProcessesOnce(t *testing.T) {
	eachServer(t, func(t *testing.T, e *env) {
		e.newStream()
		// AckWait well above the backoff: a redelivery sooner than AckWait is the nak's
		c := e.consumer("orders", func(cc *jetstream.ConsumerConfig) { cc.AckWait = 5 * time.Second })
		h := register(t, newDeduper(t, memStore(t)), "orders")
		backoff := func(n uint64) time.Duration { return time.Duration(n) * 150 * time.Millisecond }
		var asked sync.Map
		j := newJS(t, h, c, WithBackoff(func(n uint64) time.Duration { asked.Store(n, true); return backoff(n) }))

		var mu sync.Mutex
		var at []time.Time
		var r runs
		consume(t, c, j.Handler(context.Background(), func(_ context.Context, m *Msg) error {
			mu.Lock()
			at = append(at, time.Now())
			n := len(at)
			mu.Unlock()
			if n <= 2 {
				return fmt.Errorf("attempt %d fails", n)
			}
			r.add(m)
			return nil
		}))
		ack := e.publish("new", "order-1", "one")
		e.settled(c, ack.Sequence)
		e.quietFor(c, 2*testAckWait, 3)
		j.Wait()

		mu.Lock()
		defer mu.Unlock()
		if len(at) != 3 || r.of("order-1") != 1 {
			t.Fatalf("%d attempts, %d successful runs; want 3 and 1", len(at), r.of("order-1"))
		}
		for n := uint64(1); n <= 2; n++ {
			if _, ok := asked.Load(n); !ok {
				t.Fatalf("backoff not asked for delivery %d", n)
			}
			if gap := at[n].Sub(at[n-1]); gap < backoff(n) {
				t.Fatalf("delivery %d came %v after delivery %d, before its backoff %v", n+1, gap, n, backoff(n))
			}
		}
		if s := j.Stats(); s.Count(ActNakWithDelay) != 2 || s.Count(ActAck) != 1 {
			t.Fatalf("actions: nak-with-delay %d, ack %d", s.Count(ActNakWithDelay), s.Count(ActAck))
		}
	})
}

// On the last delivery a failing handler's message goes to the exhausted hook, once,
// and is terminated: the server delivers it no more and holds nothing pending.
func TestExhaustedMessageGoesToTheHookOnceAndIsTerminated(t *testing.T) {
	eachServer(t, func(t *testing.T, e *env) {
		e.newStream()
		// AckWait long: a message that is not terminated stays pending visibly
		c := e.consumer("orders", func(cc *jetstream.ConsumerConfig) { cc.MaxDeliver = 3; cc.AckWait = 2 * time.Second })
		h := register(t, newDeduper(t, memStore(t)), "orders")
		type call struct {
			delivered uint64
			err       error
		}
		calls := make(chan call, 10)
		boom := errors.New("boom")
		j := newJS(t, h, c,
			WithBackoff(func(uint64) time.Duration { return time.Millisecond }),
			WithExhausted(func(_ context.Context, m *Msg, err error) { calls <- call{m.NumDelivered(), err} }))
		var attempts atomic.Int64
		consume(t, c, j.Handler(context.Background(), func(context.Context, *Msg) error { attempts.Add(1); return boom }))
		ack := e.publish("new", "order-1", "one")

		select {
		case got := <-calls:
			if got.delivered != 3 || !errors.Is(got.err, boom) {
				t.Fatalf("exhausted hook got NumDelivered %d, err %v; want 3, boom", got.delivered, got.err)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("exhausted hook not called")
		}
		e.settled(c, ack.Sequence)
		e.quietFor(c, 2*2*time.Second, 3)
		j.Wait()
		if len(calls) != 0 || attempts.Load() != 3 {
			t.Fatalf("%d more hook calls, %d attempts; want 0 and 3", len(calls), attempts.Load())
		}
		if s := j.Stats(); s.Count(ActTerm) != 1 || s.Exhausted != 1 || s.Count(ActNakWithDelay) != 2 {
			t.Fatalf("actions: term %d, exhausted %d, nak-with-delay %d", s.Count(ActTerm), s.Exhausted, s.Count(ActNakWithDelay))
		}
	})
}

func TestPanicNaksThenProcessesOnce(t *testing.T) {
	eachServer(t, func(t *testing.T, e *env) {
		e.newStream()
		c := e.consumer("orders", func(cc *jetstream.ConsumerConfig) { cc.AckWait = 5 * time.Second })
		h := register(t, newDeduper(t, memStore(t)), "orders")
		j := newJS(t, h, c)
		var attempts atomic.Int64
		var r runs
		consume(t, c, j.Handler(context.Background(), func(_ context.Context, m *Msg) error {
			if attempts.Add(1) == 1 {
				panic("first delivery panics")
			}
			r.add(m)
			return nil
		}))
		ack := e.publish("new", "order-1", "one")
		e.settled(c, ack.Sequence)
		e.quietFor(c, 2*testAckWait, 2)
		j.Wait()
		if attempts.Load() != 2 || r.of("order-1") != 1 {
			t.Fatalf("%d attempts, %d runs; want 2 and 1", attempts.Load(), r.of("order-1"))
		}
		if s := j.Stats(); s.Count(ActNak) != 1 || s.Count(ActAck) != 1 {
			t.Fatalf("actions: nak %d, ack %d", s.Count(ActNak), s.Count(ActAck))
		}
		if h.Stats().Count(dedup.Panicked) != 1 {
			t.Fatal("panic not counted")
		}
	})
}

// A message without a key is terminated (not redelivered) under the default policy,
// and processed unguarded under ProcessMissingKey.
func TestMessageWithoutKeyIsTerminatedOrRunUnguarded(t *testing.T) {
	byOrderID := keys.Header("Order-Id")
	eachServer(t, func(t *testing.T, e *env) {
		e.newStream()
		reject := e.consumer("reject", func(cc *jetstream.ConsumerConfig) { cc.AckWait = time.Second })
		process := e.consumer("process", func(cc *jetstream.ConsumerConfig) { cc.AckWait = time.Second })
		d := newDeduper(t, memStore(t))
		jr := newJS(t, register(t, d, "reject"), reject, WithKeyStrategy(byOrderID))
		hp := register(t, d, "process", dedup.WithMissingKey(dedup.ProcessMissingKey))
		jp := newJS(t, hp, process, WithKeyStrategy(byOrderID))
		var rr, rp runs
		consume(t, reject, jr.Handler(context.Background(), func(_ context.Context, m *Msg) error { rr.add(m); return nil }))
		consume(t, process, jp.Handler(context.Background(), func(_ context.Context, m *Msg) error { rp.add(m); return nil }))

		ack := e.publish("new", "msg-1", "no order id")
		e.settled(reject, ack.Sequence)
		e.settled(process, ack.Sequence)
		e.quietFor(reject, 2*time.Second, 1)
		e.quietFor(process, 0, 1)
		jr.Wait()
		jp.Wait()
		if rr.n.Load() != 0 || jr.Stats().Count(ActTerm) != 1 {
			t.Fatalf("reject: %d runs, %d terms; want 0 and 1", rr.n.Load(), jr.Stats().Count(ActTerm))
		}
		if rp.n.Load() != 1 || jp.Stats().Count(ActAck) != 1 || hp.Stats().Unguarded != 1 {
			t.Fatalf("process: %d runs, %d acks, %d unguarded; want 1, 1, 1", rp.n.Load(), jp.Stats().Count(ActAck), hp.Stats().Unguarded)
		}
	})
}

// The same key with another payload, under fingerprinting, is terminated and never run.
func TestKeyReuseIsTerminated(t *testing.T) {
	eachServer(t, func(t *testing.T, e *env) {
		e.newStream()
		c := e.consumer("orders", func(cc *jetstream.ConsumerConfig) { cc.AckWait = time.Second })
		h := register(t, newDeduper(t, memStore(t)), "orders", dedup.WithFingerprint(true))
		j := newJS(t, h, c)
		var r runs
		consume(t, c, j.Handler(context.Background(), func(_ context.Context, m *Msg) error { r.add(m); return nil }))

		first := e.publish("new", "order-1", "two apples")
		e.settled(c, first.Sequence)
		reused := e.republish("new", "order-1", "three pears")
		e.settled(c, reused.Sequence)
		e.quietFor(c, 2*time.Second, 2)
		j.Wait()
		if r.n.Load() != 1 {
			t.Fatalf("handler ran %d times, want 1", r.n.Load())
		}
		if s := j.Stats(); s.Count(ActAck) != 1 || s.Count(ActTerm) != 1 {
			t.Fatalf("actions: ack %d, term %d", s.Count(ActAck), s.Count(ActTerm))
		}
		if h.Stats().Count(dedup.KeyReuse) != 1 {
			t.Fatal("key reuse not counted")
		}
	})
}

// Store down, failing closed: the message is nakked with the store retry delay and the
// handler does not run; once the store heals, the message is processed once.
func TestStoreDownFailingClosedNaksUntilTheStoreHeals(t *testing.T) {
	eachServer(t, func(t *testing.T, e *env) {
		e.newStream()
		c := e.consumer("orders", func(cc *jetstream.ConsumerConfig) { cc.AckWait = 5 * time.Second })
		store := &flakyStore{Store: memStore(t)}
		store.down(true)
		h := register(t, newDeduper(t, store), "orders")
		j := newJS(t, h, c, WithStoreRetryDelay(100*time.Millisecond))
		var r runs
		consume(t, c, j.Handler(context.Background(), func(_ context.Context, m *Msg) error { r.add(m); return nil }))
		ack := e.publish("new", "order-1", "one")

		testenv.Eventually(t, 10*time.Second, "redeliveries while the store is down", func() bool {
			return j.Stats().Count(ActNakWithDelay) >= 2 // AckWait is 5s: these came from the naks
		})
		if r.n.Load() != 0 {
			t.Fatal("handler ran while the store was down")
		}
		store.down(false)
		ci := e.settled(c, ack.Sequence)
		e.quietFor(c, 2*testAckWait, ci.Delivered.Consumer)
		j.Wait()
		if r.n.Load() != 1 || j.Stats().Count(ActAck) != 1 {
			t.Fatalf("%d runs, %d acks after healing; want 1 and 1", r.n.Load(), j.Stats().Count(ActAck))
		}
		if !isDone(t, store, h, "order-1") {
			t.Fatal("no DONE record after healing")
		}
	})
}

// Store down, failing open: the handler runs unguarded and the message is acked.
func TestStoreDownFailingOpenRunsUnguardedAndAcks(t *testing.T) {
	eachServer(t, func(t *testing.T, e *env) {
		e.newStream()
		c := e.consumer("orders")
		store := &flakyStore{Store: memStore(t)}
		store.down(true)
		h := register(t, newDeduper(t, store), "orders", dedup.WithStoreFailure(dedup.FailOpen))
		j := newJS(t, h, c)
		e.publish("new", "order-1", "one")

		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		msg, err := c.Next(jetstream.FetchContext(ctx))
		if err != nil {
			t.Fatal(err)
		}
		ran := false
		res, act := j.Handle(ctx, msg, func(context.Context, *Msg) error { ran = true; return nil })
		if !ran || res.Outcome != dedup.Processed || !res.Unguarded || act != ActAck {
			t.Fatalf("ran %v, result %+v, action %v; want a run, Processed unguarded, ack", ran, res, act)
		}
		e.settled(c, 1)
		e.quietFor(c, 2*testAckWait, 1)
	})
}

// A handler that runs for 3 × AckWait, with a lease a fraction of that, is kept alive:
// InProgress holds off the server's redelivery and the heartbeat extends the lease.
func TestLongHandlerIsKeptInProgress(t *testing.T) {
	eachServer(t, func(t *testing.T, e *env) {
		e.newStream()
		const ackWait = time.Second
		c := e.consumer("orders", func(cc *jetstream.ConsumerConfig) { cc.AckWait = ackWait })
		store := memStore(t)
		h := register(t, newDeduper(t, store), "orders", dedup.WithLease(ackWait/2))
		j := newJS(t, h, c)
		var r runs
		consume(t, c, j.Handler(context.Background(), func(ctx context.Context, m *Msg) error {
			r.add(m)
			select {
			case <-time.After(3 * ackWait): // the work
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}))
		ack := e.publish("new", "order-1", "one")
		e.settled(c, ack.Sequence)
		e.quietFor(c, 2*ackWait, 1)
		j.Wait()
		if r.n.Load() != 1 {
			t.Fatalf("handler ran %d times, want 1", r.n.Load())
		}
		s := j.Stats()
		if s.InProgress == 0 || s.Count(ActAck) != 1 {
			t.Fatalf("in-progress signals %d, acks %d; want > 0 and 1", s.InProgress, s.Count(ActAck))
		}
		if hs := h.Stats(); hs.Count(dedup.Processed) != 1 || hs.HeartbeatLeaseLost != 0 {
			t.Fatalf("dedup: processed %d, lease lost %d", hs.Count(dedup.Processed), hs.HeartbeatLeaseLost)
		}
	})
}

// Shutdown mid-handler: no ack, the claim is released, and another adapter instance
// (another process: its own Deduper over the same store) processes the redelivery once.
func TestShutdownLeavesMessageForRedelivery(t *testing.T) {
	eachServer(t, func(t *testing.T, e *env) {
		e.newStream()
		c := e.consumer("orders")
		store := memStore(t)
		// lease 30s (the default): had the claim not been released, the second instance
		// would see InProgress until long after this test's deadline
		h1 := register(t, newDeduper(t, store), "orders")
		j1 := newJS(t, h1, c)
		ctx, shutdown := context.WithCancel(context.Background())
		defer shutdown()
		started := make(chan struct{})
		var once sync.Once
		var stopped atomic.Bool
		cc := consume(t, c, j1.Handler(ctx, func(ctx context.Context, m *Msg) error {
			once.Do(func() { close(started) })
			<-ctx.Done()
			stopped.Store(true)
			return ctx.Err()
		}))
		ack := e.publish("new", "order-1", "one")
		<-started
		shutdown()
		testenv.Eventually(t, 5*time.Second, "the first instance to give up the message", func() bool {
			return j1.Stats().Count(ActNone) == 1
		})
		stopConsume(t, cc)
		if s := j1.Stats(); s.Count(ActAck)+s.Count(ActNak)+s.Count(ActNakWithDelay)+s.Count(ActTerm) != 0 || !stopped.Load() {
			t.Fatalf("first instance acknowledged a cancelled message: %+v", s)
		}
		if h1.Stats().Count(dedup.Cancelled) != 1 {
			t.Fatal("cancellation not counted")
		}

		h2 := register(t, newDeduper(t, store), "orders")
		j2 := newJS(t, h2, c)
		var r runs
		consume(t, c, j2.Handler(context.Background(), func(_ context.Context, m *Msg) error {
			if m.NumDelivered() < 2 {
				t.Errorf("second instance got delivery %d, want a redelivery", m.NumDelivered())
			}
			r.add(m)
			return nil
		}))
		e.settled(c, ack.Sequence)
		e.quietFor(c, 2*testAckWait, 2)
		j2.Wait()
		if r.of("order-1") != 1 || j2.Stats().Count(ActAck) != 1 {
			t.Fatalf("second instance: %d runs, %d acks; want 1 and 1", r.of("order-1"), j2.Stats().Count(ActAck))
		}
	})
}
