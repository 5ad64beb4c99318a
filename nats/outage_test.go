package nats

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/testenv"
	"github.com/dedupkit/dedupkit/keys"
)

// outage is what a Redis-outage run saw: fn runs per key, and results by outcome.
type outage struct {
	mu        sync.Mutex
	runs      map[string]int
	outcomes  map[dedup.Outcome]int
	unguarded int
	recorded  []string // keys whose DONE Redis acknowledged: the ones republished as copies
	published map[string]int
}

func (o *outage) ran(key string) {
	o.mu.Lock()
	o.runs[key]++
	o.mu.Unlock()
}

func (o *outage) result(key string, res dedup.Result) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.outcomes[res.Outcome]++
	if res.Unguarded {
		o.unguarded++
	}
	if res.Outcome == dedup.Processed && !res.Unguarded {
		o.recorded = append(o.recorded, key)
	}
}

func (o *outage) count(oc dedup.Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.outcomes[oc]
}

// aCopy returns a key already recorded DONE, "" if none yet.
func (o *outage) aCopy() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.recorded) == 0 {
		return ""
	}
	return o.recorded[rand.IntN(len(o.recorded))]
}

// Redis (appendonly, appendfsync always) is SIGKILLed for 5 s while three consumer
// instances work through a steady stream of new messages and of copies of messages
// already processed, then restarted on the same port and data directory.
//
// Fail closed: no message is lost (each key runs, nothing is terminated), none runs
// twice (the copies wait, NakWithDelay, and are acked as duplicates after the
// restart), and the backlog drains. Fail open: the runs made without dedup are
// counted in the results and in the handlers' Stats, and every duplicate run is one
// of them.
func TestRedisOutageLosesNoMessageAndCountsUnguardedRuns(t *testing.T) {
	t.Parallel()
	for _, policy := range []dedup.StoreFailurePolicy{dedup.FailClosed, dedup.FailOpen} {
		name := map[dedup.StoreFailurePolicy]string{dedup.FailClosed: "fail-closed", dedup.FailOpen: "fail-open"}[policy]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			runOutage(t, policy)
		})
	}
}

func runOutage(t *testing.T, policy dedup.StoreFailurePolicy) {
	const (
		outageFor = 5 * time.Second
		ackWait   = time.Second
		every     = 20 * time.Millisecond // one new message and one copy each
	)
	rs := testenv.SpawnRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	ns := testenv.SpawnNATS(t)
	e := connect(t, ns.URL())
	e.newStream()
	cons := e.consumer("orders", func(c *jetstream.ConsumerConfig) {
		c.AckWait = ackWait
		c.MaxDeliver = 100 // a message naked every 500ms through the outage stays far below it
	})
	prefix := testenv.Prefix()
	o := &outage{runs: map[string]int{}, outcomes: map[dedup.Outcome]int{}, published: map[string]int{}}

	var handlers []*dedup.Handler
	var adapters []*JetStream
	var calls handling // the callbacks below: each records its result after its ack
	for range 3 {
		// fail fast while Redis is down (go-redis's defaults retry a dial for about
		// 1.7s per call), so that the handlers answer, and the adapter naks, through
		// the outage instead of waiting it out
		rdb := redis.NewClient(&redis.Options{Addr: rs.Addr(), MaxRetries: 1, DialerRetries: 1,
			DialTimeout: 200 * time.Millisecond, ContextTimeoutEnabled: true})
		t.Cleanup(func() { rdb.Close() })
		store, err := redisstore.New(rdb)
		if err != nil {
			t.Fatal(err)
		}
		h := register(t, newDeduper(t, store, dedup.WithPrefix(prefix)), "orders",
			dedup.WithLease(time.Second), dedup.WithRetention(time.Hour), dedup.WithStoreFailure(policy),
			dedup.WithKeyStrategy(keys.Header("Idempotency-Key")))
		j := newJS(t, h, cons, WithStoreRetryDelay(500*time.Millisecond))
		fn := func(_ context.Context, m *Msg) error { o.ran(m.Header("Idempotency-Key")); return nil }
		cc, err := cons.Consume(calls.wrap(func(msg jetstream.Msg) {
			res, _ := j.Handle(context.Background(), msg, fn)
			o.result(msg.Headers().Get("Idempotency-Key"), res)
		}), jetstream.PullMaxMessages(16), jetstream.PullExpiry(time.Second),
			jetstream.ConsumeErrHandler(func(jetstream.ConsumeContext, error) {}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stopConsume(t, cc) })
		handlers, adapters = append(handlers, h), append(adapters, j)
	}

	// the load: one new message and one copy of a recorded one every 20ms
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for _, k := range []string{fmt.Sprintf("k%05d", i), o.aCopy()} {
				if k == "" {
					continue
				}
				m := natsgo.NewMsg(e.subject + ".new")
				m.Header.Set("Idempotency-Key", k)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := e.js.PublishMsg(ctx, m)
				cancel()
				if err != nil {
					t.Errorf("publish: %v", err)
					return
				}
				o.mu.Lock()
				o.published[k]++
				o.mu.Unlock()
			}
		}
	}()
	defer func() { // on a failure half way
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-stopped
	}()

	processed := func() int { return o.count(dedup.Processed) }
	testenv.Eventually(t, 20*time.Second, "load before the outage", func() bool { return processed() >= 50 })
	rs.Kill()
	time.Sleep(outageFor) // the outage itself, under load
	during := processed()
	if err := rs.Start(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "load after the restart", func() bool { return processed() >= during+50 })
	close(stop)
	<-stopped

	info, err := e.stream.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ci := e.settled(cons, info.State.LastSeq) // the backlog drains: everything acked
	calls.wait()
	o.mu.Lock()
	defer o.mu.Unlock()

	lost, dupKeys, dupRuns, copies := 0, 0, 0, 0
	for k, n := range o.published {
		copies += n - 1
		switch r := o.runs[k]; {
		case r == 0:
			lost++
		case r > 1:
			dupKeys++
			dupRuns += r - 1
		}
	}
	var statsUnguarded uint64
	var exhausted, terms uint64
	for i, h := range handlers {
		statsUnguarded += h.Stats().Unguarded
		exhausted += adapters[i].Stats().Exhausted
		terms += adapters[i].Stats().Count(ActTerm)
	}
	fnRuns := 0
	for _, n := range o.runs {
		fnRuns += n
	}
	oc := o.outcomes
	t.Logf("%d keys (%d messages: %d copies), %d deliveries; results: %d processed (%d unguarded), %d duplicate, %d in-progress, %d store-unavailable, %d not-recorded, %d lease-lost; fn runs %d; lost %d; duplicate runs %d (of %d keys); unguarded runs %d (Stats: %d)",
		len(o.published), len(o.published)+copies, copies, ci.Delivered.Consumer,
		oc[dedup.Processed], o.unguarded, oc[dedup.Duplicate], oc[dedup.InProgress], oc[dedup.StoreUnavailable],
		oc[dedup.NotRecorded], oc[dedup.LeaseLost], fnRuns, lost, dupRuns, dupKeys, o.unguarded, statsUnguarded)

	if lost != 0 || exhausted != 0 || terms != 0 {
		t.Fatalf("%d messages never ran, %d exhausted, %d terminated", lost, exhausted, terms)
	}
	if fnRuns != oc[dedup.Processed]+oc[dedup.NotRecorded]+oc[dedup.LeaseLost] {
		t.Fatalf("%d fn runs, but %d results say fn ran", fnRuns, oc[dedup.Processed]+oc[dedup.NotRecorded]+oc[dedup.LeaseLost])
	}
	if uint64(o.unguarded) != statsUnguarded {
		t.Fatalf("%d unguarded results, Stats say %d", o.unguarded, statsUnguarded)
	}
	switch policy {
	case dedup.FailClosed:
		if oc[dedup.StoreUnavailable] == 0 {
			t.Fatal("no StoreUnavailable: the outage was not felt")
		}
		if dupRuns != 0 || o.unguarded != 0 {
			t.Fatalf("fail closed: %d duplicate runs, %d unguarded", dupRuns, o.unguarded)
		}
	case dedup.FailOpen:
		if o.unguarded == 0 {
			t.Fatal("no unguarded run: the outage was not felt")
		}
		if dupRuns > o.unguarded {
			t.Fatalf("%d duplicate runs, but only %d runs were unguarded", dupRuns, o.unguarded)
		}
	}
}
