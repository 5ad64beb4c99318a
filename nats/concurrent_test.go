package nats

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
)

// TestConcurrentDuplicatesOnThreeConsumersRunOnce sends each message to three durable
// consumers of one stream, each with its own adapter for the same dedup handler, and
// holds the first delivery of every message at a barrier until all three have it:
// then all three handle it at the same moment. fn must run once per message, and
// every delivery must end acknowledged (at once as Processed or Duplicate, or after
// an InProgress NakWithDelay, on a redelivery that finds it Duplicate): the server
// ends with nothing pending or unacknowledged on any consumer. No delivery may be
// answered Duplicate before fn has succeeded. The handler instances are three
// Dedupers sharing one Redis (the race is on the server), or one Deduper shared by
// the three adapters (the race is in its in-flight table).
func TestConcurrentDuplicatesOnThreeConsumersRunOnce(t *testing.T) {
	concurrentCases(t, testConcurrentDuplicates)
}

// concurrentCases runs test on miniredis and redis-server, with three Dedupers and
// with one shared by the three consumers, on each NATS server.
func concurrentCases(t *testing.T, test func(t *testing.T, e *env, client *redis.Client, prefix string, shared bool)) {
	for _, rname := range []string{"miniredis", "redis-server"} {
		for _, shared := range []bool{false, true} {
			name := rname + "/three-dedupers"
			if shared {
				name = rname + "/one-deduper"
			}
			t.Run(name, func(t *testing.T) {
				eachServer(t, func(t *testing.T, e *env) {
					client, prefix := redisClients()[rname](t)
					test(t, e, client, prefix, shared)
				})
			})
		}
	}
}

const (
	concurrentMsgs      = 50
	concurrentConsumers = 3
	// The lease: a delivery that finds the message in progress is redelivered after
	// what is left of it. Long enough that a live owner keeps it on a loaded machine:
	// at 300ms (extended every 100ms), a process held up for a few hundred ms lost it
	// while its fn ran, with miniredis and with a real Redis, and another consumer
	// ran the message again (LeaseLost, fn twice).
	concurrentLease = 2 * time.Second
)

// barrier holds the callers for one id until n of them have arrived.
type barrier struct {
	n     int
	mu    sync.Mutex
	gates map[string]chan struct{}
	count map[string]int
}

func newBarrier(n int) *barrier {
	return &barrier{n: n, gates: map[string]chan struct{}{}, count: map[string]int{}}
}

// wait returns true once n callers have arrived for id, false if they have not within
// timeout (a safeguard: the test then fails, the race was not run).
func (b *barrier) wait(id string, timeout time.Duration) bool {
	b.mu.Lock()
	g, ok := b.gates[id]
	if !ok {
		g = make(chan struct{})
		b.gates[id] = g
	}
	b.count[id]++
	if b.count[id] == b.n {
		close(g)
	}
	b.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-g:
		return true
	case <-t.C:
		return false
	}
}

// handlerSource returns what gives each consumer its handler: from a Deduper of its
// own, or (shared) from one Deduper for all.
func handlerSource(t *testing.T, client *redis.Client, prefix string, shared bool, name string, opts ...dedup.HandlerOption) func() *dedup.Handler {
	store, err := redisstore.New(client)
	if err != nil {
		t.Fatal(err)
	}
	var h *dedup.Handler
	return func() *dedup.Handler {
		if h == nil || !shared {
			h = register(t, newDeduper(t, store, dedup.WithPrefix(prefix)), name, opts...)
		}
		return h
	}
}

func testConcurrentDuplicates(t *testing.T, e *env, client *redis.Client, prefix string, shared bool) {
	e.newStream()
	handler := handlerSource(t, client, prefix, shared, "charge", dedup.WithLease(concurrentLease))
	bar := newBarrier(concurrentConsumers)
	var r runs
	var missed, early atomic.Int64
	var done sync.Map // ids whose fn has returned nil
	fn := func(ctx context.Context, m *Msg) error {
		r.add(m)
		time.Sleep(5 * time.Millisecond) // the others find it in progress, or done
		done.Store(m.Header(jetstream.MsgIDHeader), true)
		return nil
	}
	type member struct {
		c jetstream.Consumer
		h *dedup.Handler
		j *JetStream
	}
	members := make([]member, concurrentConsumers)
	var calls handling // the callbacks below: each counts, and checks, after its ack
	for i := range members {
		h := handler()
		// AckWait well above the run, so every redelivery is one the adapter asked for;
		// a small pull batch, so messages do not wait long in the client.
		c := e.consumer(fmt.Sprintf("c%d", i), func(cc *jetstream.ConsumerConfig) { cc.AckWait = 10 * time.Second })
		j := newJS(t, h, c)
		cc, err := c.Consume(calls.wrap(func(msg jetstream.Msg) {
			id := msg.Headers().Get(jetstream.MsgIDHeader)
			if md, err := msg.Metadata(); err == nil && md.NumDelivered == 1 {
				if !bar.wait(id, 5*time.Second) {
					missed.Add(1)
				}
			}
			if res, _ := j.Handle(context.Background(), msg, fn); res.Outcome == dedup.Duplicate {
				if _, ok := done.Load(id); !ok {
					early.Add(1) // acknowledged as done while it was still in progress
				}
			}
		}), jetstream.PullMaxMessages(4), jetstream.PullExpiry(2*time.Second),
			jetstream.ConsumeErrHandler(func(jetstream.ConsumeContext, error) {}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stopConsume(t, cc) })
		members[i] = member{c, h, j}
	}

	consumers := make([]jetstream.Consumer, len(members))
	for i, m := range members {
		consumers[i] = m.c
	}
	last := raceMessages(t, e, "cc", consumers, &missed, &r)
	calls.wait()
	if n := early.Load(); n != 0 {
		t.Errorf("%d deliveries were answered Duplicate before fn had succeeded", n)
	}
	var summary []string
	outcomes := map[dedup.Outcome]uint64{}
	seen := map[*dedup.Handler]bool{}
	for i, m := range members {
		s := m.j.Stats()
		acks := s.Count(ActAck)
		if acks != concurrentMsgs || s.Count(ActTerm) != 0 || s.Count(ActNone) != 0 || s.AckErrors != 0 {
			t.Errorf("consumer c%d: %d acks (want %d), %d terms, %d unacknowledged, %d ack errors",
				i, acks, concurrentMsgs, s.Count(ActTerm), s.Count(ActNone), s.AckErrors)
		}
		ci := e.info(m.c)
		if ci.NumAckPending != 0 || ci.NumPending != 0 || ci.AckFloor.Stream != last {
			t.Errorf("consumer c%d: %d pending ack, %d pending, ack floor %d (want %d)",
				i, ci.NumAckPending, ci.NumPending, ci.AckFloor.Stream, last)
		}
		summary = append(summary, fmt.Sprintf("c%d %d ack + %d nak-with-delay", i, acks, s.Count(ActNakWithDelay)))
		if !seen[m.h] {
			seen[m.h] = true
			hs := m.h.Stats()
			for _, o := range []dedup.Outcome{dedup.Processed, dedup.Duplicate, dedup.InProgress} {
				outcomes[o] += hs.Count(o)
			}
		}
	}
	if outcomes[dedup.Processed] != concurrentMsgs {
		t.Errorf("%d Processed, want %d", outcomes[dedup.Processed], concurrentMsgs)
	}
	var counts []string
	for o, n := range outcomes {
		counts = append(counts, fmt.Sprintf("%v %d", o, n))
	}
	sort.Strings(counts)
	t.Logf("%d messages × %d consumers at a barrier: %s; deliveries %s", concurrentMsgs, concurrentConsumers,
		strings.Join(counts, ", "), strings.Join(summary, ", "))
}

// TestConcurrentDuplicatesThroughFilterBatchesRunOnce is the same race through a
// ModeFilter Handler, which marks in batches (one Mark of the messages that
// queue up) and makes a message whose key another batch of the same Deduper is
// marking wait for that answer. Each message reaches the three consumers' handlers at
// the same moment; fn must run once per message, and every delivery must be
// acknowledged at once.
func TestConcurrentDuplicatesThroughFilterBatchesRunOnce(t *testing.T) {
	concurrentCases(t, testConcurrentFilterBatches)
}

func testConcurrentFilterBatches(t *testing.T, e *env, client *redis.Client, prefix string, shared bool) {
	e.newStream()
	handler := handlerSource(t, client, prefix, shared, "metrics", dedup.WithMode(dedup.ModeFilter))
	bar := newBarrier(concurrentConsumers)
	var r runs
	var missed atomic.Int64
	fn := func(ctx context.Context, m *Msg) error {
		r.add(m)
		return nil
	}
	type member struct {
		c jetstream.Consumer
		j *JetStream
	}
	members := make([]member, concurrentConsumers)
	for i := range members {
		h := handler()
		c := e.consumer(fmt.Sprintf("f%d", i), func(cc *jetstream.ConsumerConfig) { cc.AckWait = 10 * time.Second })
		j := newJS(t, h, c)
		handle := j.Handler(context.Background(), fn)
		cc, err := c.Consume(func(msg jetstream.Msg) {
			if md, err := msg.Metadata(); err == nil && md.NumDelivered == 1 {
				if !bar.wait(msg.Headers().Get(jetstream.MsgIDHeader), 5*time.Second) {
					missed.Add(1)
				}
			}
			handle(msg)
		}, jetstream.PullMaxMessages(4), jetstream.PullExpiry(2*time.Second),
			jetstream.ConsumeErrHandler(func(jetstream.ConsumeContext, error) {}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stopConsume(t, cc); j.Wait() })
		members[i] = member{c, j}
	}
	consumers := make([]jetstream.Consumer, len(members))
	for i, m := range members {
		consumers[i] = m.c
	}
	raceMessages(t, e, "fb", consumers, &missed, &r)
	var summary []string
	for i, m := range members {
		m.j.Wait()
		s := m.j.Stats()
		// a mark is DONE at once, so a copy is a duplicate, never in progress: no Naks,
		// also for a copy that met another batch's mark in the shared Deduper
		if s.Count(ActAck) != concurrentMsgs || s.Count(ActNakWithDelay) != 0 || s.Count(ActTerm) != 0 || s.Count(ActNone) != 0 || s.AckErrors != 0 {
			t.Errorf("consumer f%d: actions %+v; want %d acks and nothing else", i, s, concurrentMsgs)
		}
		summary = append(summary, fmt.Sprintf("f%d %d ack + %d nak-with-delay", i, s.Count(ActAck), s.Count(ActNakWithDelay)))
	}
	t.Logf("%d messages × %d consumers at a barrier: %s", concurrentMsgs, concurrentConsumers, strings.Join(summary, ", "))
}

// raceMessages publishes concurrentMsgs messages with ids head-NNN and waits until
// every consumer has acknowledged them all. It checks that the barrier met every first
// delivery (missed) and that fn ran once per message (r), and returns the last stream
// sequence.
func raceMessages(t *testing.T, e *env, head string, consumers []jetstream.Consumer, missed *atomic.Int64, r *runs) uint64 {
	t.Helper()
	id := func(i int) string { return fmt.Sprintf("%s-%03d", head, i) }
	var last *jetstream.PubAck
	for i := range concurrentMsgs {
		last = e.publish("new", id(i), "payload "+id(i))
	}
	for _, c := range consumers {
		e.settled(c, last.Sequence)
	}
	if n := missed.Load(); n != 0 {
		t.Errorf("%d first deliveries were not met by the other consumers within 5s: the race was not run for them", n)
	}
	if got := r.n.Load(); got != concurrentMsgs {
		t.Errorf("fn ran %d times for %d messages", got, concurrentMsgs)
	}
	for i := range concurrentMsgs {
		if n := r.of(id(i)); n != 1 {
			t.Errorf("fn ran %d times for %s", n, id(i))
		}
	}
	return last.Sequence
}
