package nats

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/internal/testenv"
)

// Transactional consumers as processes (child_test.go) on PostgreSQL: killed between
// COMMIT and the completion, and paused past their lease with a transaction open.

// txProcEnv is a procEnv with a PostgreSQL marker table and orders table of its own.
type txProcEnv struct {
	*procEnv
	d   *orderDB
	dsn string
}

func newTxProcEnv(t *testing.T, ackWait time.Duration) *txProcEnv {
	t.Helper()
	dsn := testenv.PostgresURL(t)
	p := newProcEnv(t, ackWait)
	return &txProcEnv{procEnv: p, d: newOrderDB(t, "postgres"), dsn: dsn}
}

// child starts a consumer process whose handler is transactional (plain: its insert
// commits on its own, with no marker).
func (p *txProcEnv) child(name, mode, fn, key string, lease time.Duration, plain, hangComplete bool) *child {
	p.t.Helper()
	return startChild(p.t, name, childConfig{
		NATS: p.nc.ConnectedUrl(), Redis: p.redis.Addr(), Prefix: p.prefix,
		Stream: "DKT_" + p.id, Consumer: "orders",
		Lease: lease, Mode: mode, Fn: fn, Key: key,
		DB: "postgres", DSN: p.dsn, Markers: p.d.markers, Orders: p.d.orders,
		Plain: plain, HangComplete: hangComplete,
	})
}

// A consumer SIGKILLed after its transaction committed and before its completion
// reached Redis: the redelivery finds the marker, answers Duplicate from the
// database (acked) and repairs the Redis record; the order's row is committed once.
// The same crash without the marker (plain: the effect committed on its own) runs
// the order again: two rows.
func TestTxProcessKilledAfterCommitIsADuplicateFromTheMarker(t *testing.T) {
	for _, plain := range []bool{false, true} {
		name := map[bool]string{false: "marker", true: "without-marker"}[plain]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			const lease, ackWait = time.Second, 500 * time.Millisecond
			p := newTxProcEnv(t, ackWait)
			var last uint64
			for i := 1; i <= 3; i++ {
				last = p.publish("new", fmt.Sprintf("order-%d", i), "data").Sequence
			}
			a := p.child("A", "next", "work", "order-1", lease, plain, true) // takes order-1 only
			a.waitFor(20*time.Second, "order-1's completion", func(e event) bool { return e.kind == "completing" && e.fields[0] == "order-1" })
			a.kill() // committed, not completed
			if rows := p.d.rows(t, "order-1"); rows != 1 {
				t.Fatalf("order-1 has %d rows after the kill, want 1 (committed)", rows)
			}
			// without the marker, the run held a claim; with it, it claimed nothing
			if v := p.record("order-1"); strings.HasPrefix(v, "p:") != plain || (!plain && v != "") {
				t.Fatalf("order-1's record after the kill: %q (claim wanted: %v)", v, plain)
			}
			r := p.child("R", "consume", "work", "", lease, plain, false)
			want := "duplicate"
			if plain {
				want = "processed"
			}
			r.waitFor(20*time.Second, "order-1 "+want+" by R", func(e event) bool {
				k, _, o, _, ok := e.result()
				return ok && k == "order-1" && o == want
			})
			p.settled(p.cons, last)
			r.stop()
			if !plain {
				tier := r.waitFor(time.Second, "order-1's tier", func(e event) bool {
					return e.kind == "tier" && e.fields[0] == "order-1" && e.fields[1] != "none"
				})
				if tier.fields[1] != "database" {
					t.Errorf("order-1's duplicate answered by %s, want the database", tier.fields[1])
				}
				if v := p.record("order-1"); !strings.HasPrefix(v, "d:") {
					t.Errorf("order-1's record: %q, want DONE (repaired)", v)
				}
			}
			wantRows := map[bool]int{false: 1, true: 2}[plain]
			if rows := p.d.rows(t, "order-1"); rows != wantRows {
				t.Errorf("order-1 committed %d times, want %d", rows, wantRows)
			}
			for _, k := range []string{"order-2", "order-3"} {
				if rows := p.d.rows(t, k); rows != 1 {
					t.Errorf("%s committed %d times", k, rows)
				}
			}
		})
	}
}

// Two runs of one order overlap: A holds its transaction open (its row and marker
// written) and is SIGSTOPped past its AckWait; B takes the redelivery and waits at
// the marker A's transaction holds (a transactional run claims nothing in Redis). A,
// resumed, commits; B then finds the marker: its transaction rolls back and it
// answers Duplicate, acked. The order is committed once.
func TestTxProcessPausedPastLeaseCommitsTheOrderOnce(t *testing.T) {
	t.Parallel()
	const lease, ackWait = time.Second, 500 * time.Millisecond
	p := newTxProcEnv(t, ackWait)
	last := p.publish("new", "order-1", "data").Sequence
	a := p.child("A", "next", "hold-ignore", "order-1", lease, false, false)
	a.waitFor(10*time.Second, "order-1 started", func(e event) bool { return e.kind == "started" && e.fields[0] == "order-1" })
	a.signal(syscall.SIGSTOP)
	b := p.child("B", "consume", "work", "", lease, false, false)
	// B gets the redelivery and waits at the marker A holds: its fn does not start
	testenv.Eventually(t, 10*time.Second, "B waiting at A's marker", func() bool {
		var n int
		err := p.d.db.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%"+p.d.markers+"%'").Scan(&n)
		return err == nil && n > 0
	})
	time.Sleep(300 * time.Millisecond)
	for _, e := range b.all() {
		if e.kind == "started" || e.kind == "result" {
			t.Fatalf("B: %v while A's transaction held order-1's marker", e)
		}
	}
	a.signal(syscall.SIGCONT)
	a.send("finish")
	ra := a.waitFor(10*time.Second, "A's result", func(e event) bool { _, _, _, _, ok := e.result(); return ok })
	rb := b.waitFor(20*time.Second, "B's acked result", func(e event) bool {
		k, _, _, act, ok := e.result()
		return ok && k == "order-1" && act == "ack"
	})
	p.settled(p.cons, last)
	b.stop()
	t.Logf("A: %v; B: %v; B's results %v", ra, rb, outcomes(b.results("order-1")))
	if rows := p.d.rows(t, "order-1"); rows != 1 {
		t.Fatalf("order-1 committed %d times, want once", rows)
	}
	if _, _, o, _, _ := ra.result(); o != "processed" {
		t.Errorf("A: %s, want processed (it committed)", o)
	}
	if _, _, o, _, _ := rb.result(); o != "duplicate" {
		t.Errorf("B: %s, want duplicate (it found A's marker)", o)
	}
}
