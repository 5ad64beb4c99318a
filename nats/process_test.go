package nats

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/internal/embedded"
	"github.com/dedupkit/dedupkit/internal/testenv"
	"github.com/dedupkit/dedupkit/keys"
)

// Consumers as real processes (see child_test.go) on a redis-server and a
// nats-server of the test's own: killed, paused and resumed by their PIDs.

// procEnv is one process-level test's servers, stream and consumer.
type procEnv struct {
	*env
	redis  *embedded.Proc
	rdb    *redis.Client
	prefix string
	cons   jetstream.Consumer
}

func newProcEnv(t *testing.T, ackWait time.Duration) *procEnv {
	t.Helper()
	rs := testenv.SpawnRedis(t)
	ns := testenv.SpawnNATS(t)
	e := connect(t, ns.URL())
	e.newStream()
	cons := e.consumer("orders", func(c *jetstream.ConsumerConfig) {
		c.AckWait = ackWait
		c.MaxDeliver = 50
	})
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	t.Cleanup(func() { rdb.Close() })
	return &procEnv{env: e, redis: rs, rdb: rdb, prefix: testenv.Prefix(), cons: cons}
}

// child starts a consumer process on the test's consumer.
func (p *procEnv) child(name, mode, fn string, lease time.Duration) *child {
	p.t.Helper()
	return startChild(p.t, name, childConfig{
		NATS: p.nc.ConnectedUrl(), Redis: p.redis.Addr(), Prefix: p.prefix,
		Stream: "DKT_" + p.id, Consumer: "orders",
		Lease: lease, Mode: mode, Fn: fn,
	})
}

// record returns key's record value ("" when there is none).
func (p *procEnv) record(key string) string {
	p.t.Helper()
	v, err := p.rdb.Get(context.Background(), keys.RecordKey(p.prefix, "orders", key)).Result()
	if err == redis.Nil {
		return ""
	}
	if err != nil {
		p.t.Fatal(err)
	}
	return v
}

func outcomes(evs []event) []string {
	var out []string
	for _, e := range evs {
		_, _, o, a, _ := e.result()
		out = append(out, o+"/"+a)
	}
	return out
}

// A consumer process claims a message and is SIGKILLed before it completes. Its claim
// stays IN PROGRESS (nobody else runs the message) until the lease ends; JetStream
// redelivers the message to the other consumer, which naks it while the dead owner's
// lease lasts, then runs it: exactly once in all, and every other message once too.
func TestProcessKilledAfterClaimRunsTheMessageOnceAfterTheLease(t *testing.T) {
	t.Parallel()
	const lease, ackWait = 2 * time.Second, 500 * time.Millisecond
	p := newProcEnv(t, ackWait)
	var last uint64
	for i := 1; i <= 5; i++ {
		last = p.publish("new", fmt.Sprintf("order-%d", i), "data").Sequence
	}

	a := p.child("A", "next", "block", lease) // takes order-1 only
	a.waitFor(10*time.Second, "order-1 started", func(e event) bool { return e.kind == "started" && e.fields[0] == "order-1" })
	r := p.child("R", "consume", "work", lease)
	a.kill() // SIGKILL while its handler runs
	if v := p.record("order-1"); !strings.HasPrefix(v, "p:") {
		t.Fatalf("order-1's record after the crash: %q, want the dead owner's IN PROGRESS claim", v)
	}

	r.waitFor(20*time.Second, "order-1 processed by R", func(e event) bool {
		k, _, o, _, ok := e.result()
		return ok && k == "order-1" && o == "processed"
	})
	ci := p.settled(p.cons, last)
	p.quietFor(p.cons, 2*ackWait, ci.Delivered.Consumer)
	st := r.stop()

	done, started := effects(t, p.rdb, p.prefix, "done"), effects(t, p.rdb, p.prefix, "started")
	t.Logf("R's results for order-1: %v; done %v; started %v; R %v", outcomes(r.results("order-1")), done, started, st)
	want := []string{}
	for i := 1; i <= 5; i++ {
		want = append(want, r.by(fmt.Sprintf("order-%d", i)))
	}
	if !sameSet(done, want) {
		t.Errorf("done %v; want every order exactly once, by R", done)
	}
	if !slices.Contains(started, a.by("order-1")) || !slices.Contains(started, r.by("order-1")) {
		t.Errorf("started %v: want order-1 started by A (killed) and by R", started)
	}
	if v := p.record("order-1"); !strings.HasPrefix(v, "d:") {
		t.Errorf("order-1's record: %q, want DONE", v)
	}
}

// A live handler that runs for several leases keeps its claim through heartbeats:
// another process that gets the same message (republished with its Nats-Msg-Id) sees
// InProgress each time, naks, and acks it as a duplicate once the slow one is done;
// the slow process's own delivery is kept in progress and never redelivered.
func TestProcessSlowHandlerKeepsLease(t *testing.T) {
	t.Parallel()
	// a lease (and an AckWait) that a live process keeps on a loaded machine: at a
	// 300ms lease (extended every 100ms), S, held up for a few hundred ms, lost it
	const lease, ackWait = 2 * time.Second, 2 * time.Second
	p := newProcEnv(t, ackWait)
	p.publish("new", "order-1", "data")

	s := p.child("S", "next", "hold", lease)
	s.waitFor(10*time.Second, "order-1 started", func(e event) bool { return e.kind == "started" })
	began := time.Now()
	r := p.child("R", "consume", "work", lease)
	again := p.republish("new", "order-1", "data")
	// keep S running for three leases (three AckWaits), and until R has been told
	// InProgress three times
	r.waitFor(30*time.Second, "three InProgress answers", func(event) bool {
		n := 0
		for _, e := range r.results("order-1") {
			if _, _, o, _, _ := e.result(); o == "in-progress" {
				n++
			}
		}
		return n >= 3 && time.Since(began) >= 3*lease
	})
	s.send("finish")
	s.waitFor(10*time.Second, "S's result", func(e event) bool { return e.kind == "result" })
	r.waitFor(10*time.Second, "R's duplicate", func(e event) bool {
		_, _, o, _, ok := e.result()
		return ok && o == "duplicate"
	})
	p.settled(p.cons, again.Sequence)
	held := time.Since(began)
	sst, rst := s.stop(), r.stop()

	sres := s.results("order-1")
	t.Logf("S held order-1 for %v (lease %v); S: %v %v; R: %v %v", held.Round(time.Millisecond), lease,
		outcomes(sres), sst, outcomes(r.results("order-1")), rst)
	if len(sres) != 1 || outcomes(sres)[0] != "processed/ack" {
		t.Fatalf("S: %v; want processed/ack", outcomes(sres))
	}
	for _, e := range r.results("order-1") {
		if _, seq, o, _, _ := e.result(); seq != again.Sequence || o != "in-progress" && o != "duplicate" {
			t.Fatalf("R: %v; want only in-progress and duplicate, for the republished message", e)
		}
	}
	if done := effects(t, p.rdb, p.prefix, "done"); !slices.Equal(done, []string{s.by("order-1")}) {
		t.Fatalf("done %v; want order-1 once, by S", done)
	}
	if started := effects(t, p.rdb, p.prefix, "started"); len(started) != 1 {
		t.Fatalf("started %v; R must not have run it", started)
	}
}

// A consumer paused (SIGSTOP) past its lease loses it: JetStream redelivers the message
// to another consumer, which claims it and runs it. This is the duplicate window the
// README's Limits name: the paused one's fn had started, and the other ran fn too.
// Resumed (SIGCONT), the paused one's heartbeat finds its lease lost and cancels fn. If
// fn honours its context, it stops: LeaseLost, neither completed nor acked. If it
// ignores it and succeeds, its side effect happens a second time, and it is recorded
// and acked (Processed): DONE is true whoever holds the key (docs/design.md §3).
func TestProcessPausedPastLease(t *testing.T) {
	t.Parallel()
	for _, fn := range []string{"hold", "hold-ignore"} {
		t.Run(fn, func(t *testing.T) {
			t.Parallel()
			const lease, ackWait = 300 * time.Millisecond, time.Second
			p := newProcEnv(t, ackWait)
			seq := p.publish("new", "order-1", "data").Sequence

			pz := p.child("P", "next", fn, lease)
			pz.waitFor(10*time.Second, "order-1 started", func(e event) bool { return e.kind == "started" })
			pz.signal(syscall.SIGSTOP)
			t.Cleanup(func() { _ = pz.cmd.Process.Signal(syscall.SIGCONT) }) // should the test stop half way
			testenv.Eventually(t, 10*time.Second, "P's claim to expire", func() bool { return p.record("order-1") == "" })

			r := p.child("R", "consume", "work", lease)
			r.waitFor(20*time.Second, "R to process order-1", func(e event) bool {
				_, _, o, _, ok := e.result()
				return ok && o == "processed"
			})
			if fn == "hold-ignore" {
				pz.send("finish") // read on resume: fn returns nil and tries to complete
			}
			pz.signal(syscall.SIGCONT)
			pres := pz.waitFor(10*time.Second, "P's result", func(e event) bool { return e.kind == "result" })
			p.settled(p.cons, seq)
			pst, rst := pz.stop(), r.stop()
			started, done := effects(t, p.rdb, p.prefix, "started"), effects(t, p.rdb, p.prefix, "done")
			t.Logf("P: %v (%v); R: %v (%v); started %v; done %v", pres, pst, outcomes(r.results("order-1")), rst, started, done)

			wantO, wantA, wantAcks := "lease-lost", "none", "0"
			if fn == "hold-ignore" {
				wantO, wantA, wantAcks = "processed", "ack", "1"
			}
			if _, _, o, a, _ := pres.result(); o != wantO || a != wantA {
				t.Fatalf("P after resume: %v; want %s, %s", pres, wantO, wantA)
			}
			if pst.fields[1] != wantAcks {
				t.Fatalf("P's acks: %v, want %s", pst, wantAcks)
			}
			if v := p.record("order-1"); !strings.HasPrefix(v, "d:") {
				t.Fatalf("record %q, want DONE", v)
			}
			// the window: fn ran in both
			if !slices.Equal(started, []string{pz.by("order-1"), r.by("order-1")}) {
				t.Fatalf("started %v; want P then R", started)
			}
			want := []string{r.by("order-1")}
			if fn == "hold-ignore" {
				want = append(want, pz.by("order-1")) // its side effect, a second time
			} else if !slices.ContainsFunc(pz.all(), func(e event) bool {
				return e.kind == "ctx-done" && strings.Contains(strings.Join(e.fields, " "), "lease lost")
			}) {
				t.Fatalf("P's fn was not cancelled with ErrLeaseLost: %v", pz.all())
			}
			if !slices.Equal(done, want) {
				t.Fatalf("done %v; want %v", done, want)
			}
		})
	}
}

// sameSet reports whether a and b hold the same strings, counting repeats.
func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
