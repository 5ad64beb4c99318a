package txtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// short is the retention of markers a test waits to expire.
const short = 300 * time.Millisecond

var owners struct {
	mu sync.Mutex
	n  int
}

// owner returns an owner token no other run in the process has.
func owner() string {
	owners.mu.Lock()
	defer owners.mu.Unlock()
	owners.n++
	return fmt.Sprintf("owner-%d-%d", time.Now().UnixNano(), owners.n)
}

func marker(handler, key, fp string, retention time.Duration) dedup.Marker {
	return dedup.Marker{Handler: handler, Digest: dedup.RecordDigest("dedup:" + handler + ":" + key),
		Fingerprint: fp, Owner: owner(), Retention: retention}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Run runs the suite against h's dialect.
func Run[T any](t *testing.T, h Harness[T]) {
	s := suite[T]{h: h}
	t.Run("NewFoundExpired", s.newFoundExpired)
	t.Run("MultiRowMix", s.multiRowMix)
	t.Run("BlockedBeginFindsCommitted", func(t *testing.T) { s.blocked(t, true) })
	t.Run("BlockedBeginWritesRolledBack", func(t *testing.T) { s.blocked(t, false) })
	t.Run("BeginCtxBoundsWait", s.beginCtxBoundsWait)
	t.Run("TxOutlivesBeginCtx", s.txOutlivesCtx)
	t.Run("SavepointRollbackTo", s.savepointRollbackTo)
	t.Run("RollbackToSparesFoundMarker", s.rollbackToSparesFound)
	t.Run("Rollback", s.rollback)
	t.Run("ConcurrentRunsCommitOnce", s.concurrent)
	t.Run("CommitUnknownAfterCommit", func(t *testing.T) { s.commitUnknown(t, testenv.CutAfterCommit) })
	t.Run("CommitUnknownBeforeCommit", func(t *testing.T) { s.commitUnknown(t, testenv.CutBeforeCommit) })
	t.Run("CommitFailsCutAtStatement", func(t *testing.T) { s.commitNotSent(t, false) })
	t.Run("CommitFailsResetBeforeCommit", func(t *testing.T) { s.commitNotSent(t, true) })
	t.Run("CommitRejected", s.commitRejected)
	t.Run("Sweep", s.sweep)
	t.Run("SweepSparesTakenOver", s.sweepSparesTakenOver)
	t.Run("SweeperStopsAtClose", s.sweeperClose)
	t.Run("TableInjection", s.tableInjection)
	t.Run("SchemaQualifiedTable", s.schemaQualified)
	t.Run("DigestOnly", s.digestOnly)
	t.Run("SchemaMigrate", s.schemaMigrate)
	t.Run("BeginValidation", s.beginValidation)
	t.Run("BeginErrorLeavesNoTx", s.beginErrorNoTx)
}

type suite[T any] struct{ h Harness[T] }

func (s suite[T]) env(t *testing.T, o Opts) *Env[T] {
	t.Helper()
	e := s.h.New(t, o)
	t.Cleanup(func() { e.Close() })
	return e
}

// begin calls Begin and fails the test on an error.
func begin[T any](t *testing.T, e *Env[T], ms ...dedup.Marker) (T, []dedup.MarkerState) {
	t.Helper()
	tx, found, err := e.Tr.Begin(ctxT(t), ms)
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	// a test that fails with tx open must not hold the locks the table's DROP would
	// wait for (MySQL); registered after the DROP, this runs before it
	t.Cleanup(func() { _ = e.Tr.Rollback(context.Background(), tx) })
	if len(found) != len(ms) {
		t.Fatalf("Begin: %d states for %d markers", len(found), len(ms))
	}
	return tx, found
}

func commit[T any](t *testing.T, e *Env[T], tx T) {
	t.Helper()
	if err := e.Tr.Commit(ctxT(t), tx); err != nil {
		t.Fatalf("Commit: %v", err)
	}
}

func lookup[T any](t *testing.T, e *Env[T], m dedup.Marker) (Info, bool) {
	t.Helper()
	info, ok, err := e.Lookup(ctxT(t), m.Handler, m.Digest)
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	return info, ok
}

// waitExpired waits until the database's clock has passed m's expiry.
func waitExpired[T any](t *testing.T, e *Env[T], m dedup.Marker) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "the marker to expire by the database's clock", func() bool {
		info, ok := lookup(t, e, m)
		return ok && info.ExpiresIn <= 0
	})
}

// workTable creates a table for a handler's writes, dropped at cleanup.
func workTable[T any](t *testing.T, e *Env[T], extra string) string {
	t.Helper()
	name := e.Table + "_w"
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		name = name[i+1:]
	}
	DropTable(t, e, name)
	if err := e.DBExec(ctxT(t), "CREATE TABLE "+name+" (id INTEGER PRIMARY KEY, v INTEGER"+extra+")"); err != nil {
		t.Fatalf("create work table: %v", err)
	}
	return name
}

func count[T any](t *testing.T, e *Env[T], query string, args ...any) int64 {
	t.Helper()
	n, err := e.Count(ctxT(t), query, args...)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

func (s suite[T]) newFoundExpired(t *testing.T) {
	e := s.env(t, Opts{})
	m := marker("h", "k1", "fp-1", short)
	tx, found := begin(t, e, m)
	if found[0].Found {
		t.Fatalf("new marker reported found: %+v", found[0])
	}
	commit(t, e, tx)
	info, ok := lookup(t, e, m)
	if !ok || info.Owner != m.Owner || info.Fingerprint != "fp-1" || info.ExpiresIn <= 0 || info.ExpiresIn > short {
		t.Fatalf("after commit: %+v found=%v, want owner %s, fp-1, expiring within %v", info, ok, m.Owner, short)
	}

	again := m
	again.Owner, again.Fingerprint, again.Retention = owner(), "fp-2", time.Hour
	tx, found = begin(t, e, again)
	if !found[0].Found || found[0].Fingerprint != "fp-1" {
		t.Fatalf("second run: %+v, want found with fp-1", found[0])
	}
	if err := e.Tr.Rollback(ctxT(t), tx); err != nil {
		t.Fatal(err)
	}
	if info, _ := lookup(t, e, m); info.Owner != m.Owner {
		t.Fatalf("a found marker was changed: owner %s, want %s", info.Owner, m.Owner)
	}

	waitExpired(t, e, m)
	tx, found = begin(t, e, again)
	if found[0].Found {
		t.Fatalf("expired marker reported found: %+v", found[0])
	}
	commit(t, e, tx)
	info, ok = lookup(t, e, m)
	if !ok || info.Owner != again.Owner || info.Fingerprint != "fp-2" || info.ExpiresIn < 50*time.Minute {
		t.Fatalf("after takeover: %+v, want owner %s, fp-2, about an hour left", info, again.Owner)
	}
}

func (s suite[T]) multiRowMix(t *testing.T) {
	e := s.env(t, Opts{})
	kept := marker("h", "kept", "fa", time.Hour)
	expired := marker("h", "expired", "fb", short)
	tx, _ := begin(t, e, kept, expired)
	commit(t, e, tx)
	waitExpired(t, e, expired)

	fresh := marker("h", "fresh", "fc", time.Hour)
	otherHandler := kept // same digest, another handler: another marker
	otherHandler.Handler, otherHandler.Owner = "h2", owner()
	kept2, expired2 := kept, expired
	kept2.Owner, expired2.Owner, expired2.Retention = owner(), owner(), time.Hour
	ms := []dedup.Marker{fresh, kept2, expired2, otherHandler}
	tx, found := begin(t, e, ms...)
	want := []dedup.MarkerState{{}, {Found: true, Fingerprint: "fa"}, {}, {}}
	for i := range want {
		if found[i] != want[i] {
			t.Fatalf("found = %+v, want %+v", found, want)
		}
	}
	commit(t, e, tx)
	for i, m := range ms {
		wantOwner := m.Owner
		if i == 1 {
			wantOwner = kept.Owner
		}
		if info, ok := lookup(t, e, m); !ok || info.Owner != wantOwner {
			t.Fatalf("marker %d: %+v found=%v, want owner %s", i, info, ok, wantOwner)
		}
	}
}

// blocked: a Begin behind another transaction's uncommitted marker waits for it,
// then finds the marker (committed) or writes it (rolled back).
func (s suite[T]) blocked(t *testing.T, commitFirst bool) {
	e := s.env(t, Opts{})
	m := marker("h", "k", "fp-first", time.Hour)
	tx1, _ := begin(t, e, m)
	second := m
	second.Owner, second.Fingerprint = owner(), "fp-second"
	type result struct {
		tx    T
		found []dedup.MarkerState
		err   error
	}
	done := make(chan result, 1)
	go func() {
		tx, found, err := e.Tr.Begin(context.Background(), []dedup.Marker{second})
		done <- result{tx, found, err}
	}()
	select {
	case r := <-done:
		if r.err == nil {
			_ = e.Tr.Rollback(context.Background(), r.tx)
		}
		t.Fatalf("Begin did not wait for the uncommitted marker: %+v, %v", r.found, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	if commitFirst {
		commit(t, e, tx1)
	} else if err := e.Tr.Rollback(ctxT(t), tx1); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Begin still waits after the other transaction ended")
	}
	if r.err != nil {
		t.Fatalf("Begin: %v", r.err)
	}
	defer e.Tr.Rollback(context.Background(), r.tx)
	if commitFirst && (!r.found[0].Found || r.found[0].Fingerprint != "fp-first") {
		t.Fatalf("after the commit: %+v, want found with fp-first", r.found[0])
	}
	if !commitFirst && r.found[0].Found {
		t.Fatalf("after the rollback: %+v, want written", r.found[0])
	}
}

func (s suite[T]) beginCtxBoundsWait(t *testing.T) {
	e := s.env(t, Opts{})
	m := marker("h", "k", "", time.Hour)
	tx1, _ := begin(t, e, m)
	defer e.Tr.Rollback(context.Background(), tx1)
	inUse := e.InUse()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	second := m
	second.Owner = owner()
	start := time.Now()
	tx, _, err := e.Tr.Begin(ctx, []dedup.Marker{second})
	if err == nil {
		_ = e.Tr.Rollback(context.Background(), tx)
		t.Fatal("Begin behind an uncommitted marker returned without error past its ctx")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("Begin returned after %v, its ctx ended after 300ms", d)
	}
	testenv.Eventually(t, 5*time.Second, "Begin's connection back in the pool", func() bool { return e.InUse() == inUse })
}

func (s suite[T]) txOutlivesCtx(t *testing.T) {
	e := s.env(t, Opts{})
	w := workTable(t, e, "")
	m := marker("h", "k", "", time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	tx, _, err := e.Tr.Begin(ctx, []dedup.Marker{m})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	time.Sleep(50 * time.Millisecond) // database/sql's watcher would roll back now
	if err := e.Exec(ctxT(t), tx, "INSERT INTO "+w+" (id, v) VALUES (?, ?)", 1, 1); err != nil {
		t.Fatalf("write after Begin's ctx ended: %v", err)
	}
	commit(t, e, tx)
	if _, ok := lookup(t, e, m); !ok {
		t.Fatal("marker not committed")
	}
}

func (s suite[T]) savepointRollbackTo(t *testing.T) {
	e := s.env(t, Opts{})
	w := workTable(t, e, "")
	ms := []dedup.Marker{marker("h", "a", "", time.Hour), marker("h", "b", "", time.Hour), marker("h", "c", "", time.Hour)}
	tx, _ := begin(t, e, ms...)
	ctx := ctxT(t)
	for i, m := range ms {
		if err := e.Tr.Savepoint(ctx, tx); err != nil {
			t.Fatal(err)
		}
		if err := e.Exec(ctx, tx, "INSERT INTO "+w+" (id, v) VALUES (?, ?)", i, i); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			// A failing statement: on PostgreSQL it aborts the transaction, and
			// RollbackTo must recover it.
			if err := e.Exec(ctx, tx, "INSERT INTO "+w+" (id, v) VALUES (?, ?)", i, i); err == nil {
				t.Fatal("duplicate key insert succeeded")
			}
			if err := e.Tr.RollbackTo(ctx, tx, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	commit(t, e, tx)
	for i, m := range ms {
		_, ok := lookup(t, e, m)
		rows := count(t, e, "SELECT count(*) FROM "+w+" WHERE id = ?", i)
		if want := i != 1; ok != want || (rows == 1) != want {
			t.Fatalf("item %d: marker %v, %d rows; want both %v", i, ok, rows, want)
		}
	}
}

func (s suite[T]) rollbackToSparesFound(t *testing.T) {
	e := s.env(t, Opts{})
	m := marker("h", "k", "", time.Hour)
	tx, _ := begin(t, e, m)
	commit(t, e, tx)
	again := m
	again.Owner = owner()
	tx, found := begin(t, e, again)
	if !found[0].Found {
		t.Fatal("not found")
	}
	if err := e.Tr.Savepoint(ctxT(t), tx); err != nil {
		t.Fatal(err)
	}
	if err := e.Tr.RollbackTo(ctxT(t), tx, again); err != nil {
		t.Fatal(err)
	}
	commit(t, e, tx)
	if info, ok := lookup(t, e, m); !ok || info.Owner != m.Owner {
		t.Fatalf("RollbackTo of a found marker deleted or changed it: %+v %v", info, ok)
	}
}

func (s suite[T]) rollback(t *testing.T) {
	e := s.env(t, Opts{})
	w := workTable(t, e, "")
	m := marker("h", "k", "", time.Hour)
	tx, _ := begin(t, e, m)
	if err := e.Exec(ctxT(t), tx, "INSERT INTO "+w+" (id, v) VALUES (?, ?)", 1, 1); err != nil {
		t.Fatal(err)
	}
	if err := e.Tr.Rollback(ctxT(t), tx); err != nil {
		t.Fatal(err)
	}
	if err := e.Tr.Rollback(ctxT(t), tx); err != nil {
		t.Fatalf("second Rollback: %v", err)
	}
	if _, ok := lookup(t, e, m); ok {
		t.Fatal("marker survived Rollback")
	}
	if n := count(t, e, "SELECT count(*) FROM "+w); n != 0 {
		t.Fatalf("%d rows survived Rollback", n)
	}
	if n := e.InUse(); n != 0 {
		t.Fatalf("%d connections still in use", n)
	}
}

// concurrent: runs of one message racing through Begin commit its effect once.
func (s suite[T]) concurrent(t *testing.T) {
	e := s.env(t, Opts{})
	w := workTable(t, e, "")
	m := marker("h", "k", "", time.Hour)
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			run := m
			run.Owner = owner()
			tx, found, err := e.Tr.Begin(ctx, []dedup.Marker{run})
			if err != nil {
				errs <- err
				return
			}
			if found[0].Found {
				errs <- e.Tr.Rollback(ctx, tx)
				return
			}
			if err := e.Exec(ctx, tx, "INSERT INTO "+w+" (id, v) VALUES (?, ?)", i, i); err != nil {
				errs <- errors.Join(err, e.Tr.Rollback(ctx, tx))
				return
			}
			errs <- e.Tr.Commit(ctx, tx)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := count(t, e, "SELECT count(*) FROM "+w); n != 1 {
		t.Fatalf("%d runs committed their effect, want 1", n)
	}
}

func (s suite[T]) commitUnknown(t *testing.T, fault testenv.CommitFault) {
	if s.h.Dialect == SQLite {
		t.Skip("SQLite runs in-process: no connection to lose")
	}
	e := s.env(t, Opts{Proxied: true})
	w := workTable(t, e, "")
	m := marker("h", "k", "", time.Hour)
	tx, _ := begin(t, e, m)
	if err := e.Exec(ctxT(t), tx, "INSERT INTO "+w+" (id, v) VALUES (?, ?)", 1, 1); err != nil {
		t.Fatal(err)
	}
	e.Proxy.ArmCommit(fault)
	err := e.Tr.Commit(ctxT(t), tx)
	if e.Proxy.Hits() != 1 {
		t.Fatalf("the proxy faulted %d COMMITs, want 1", e.Proxy.Hits())
	}
	if !errors.Is(err, dedup.ErrCommitUnknown) {
		t.Fatalf("Commit with the connection cut: %v, want an error wrapping ErrCommitUnknown", err)
	}
	// unknown is the only honest answer: the client saw the same either way
	committed := fault == testenv.CutAfterCommit
	testenv.Eventually(t, 10*time.Second, "the server to settle the cut transaction", func() bool {
		_, ok := lookup(t, e, m)
		return ok == committed
	})
	if n := count(t, e, "SELECT count(*) FROM "+w); (n == 1) != committed {
		t.Fatalf("%d effect rows, committed=%v", n, committed)
	}
	redeliver(t, e, m, committed)
}

// redeliver runs the redelivery of m's message after a failed commit: its Begin
// finds the marker when the commit happened, and writes it when not.
func redeliver[T any](t *testing.T, e *Env[T], m dedup.Marker, committed bool) {
	t.Helper()
	again := m
	again.Owner = owner()
	tx, found := begin(t, e, again)
	if err := e.Tr.Rollback(ctxT(t), tx); err != nil {
		t.Fatal(err)
	}
	if found[0].Found != committed {
		t.Fatalf("the redelivery's Begin: found=%v, want %v (committed=%v)", found[0].Found, committed, committed)
	}
}

// commitNotSent: the connection is lost before the COMMIT leaves the client (cut
// during a statement, or reset just before the COMMIT). Commit fails without
// ErrCommitUnknown: the transaction rolled back, and the message can run again.
func (s suite[T]) commitNotSent(t *testing.T, reset bool) {
	if s.h.Dialect == SQLite {
		t.Skip("SQLite runs in-process: no connection to lose")
	}
	e := s.env(t, Opts{Proxied: true})
	w := workTable(t, e, "")
	m := marker("h", "k", "", time.Hour)
	tx, _ := begin(t, e, m)
	if err := e.Exec(ctxT(t), tx, "INSERT INTO "+w+" (id, v) VALUES (?, ?)", 1, 1); err != nil {
		t.Fatal(err)
	}
	if reset {
		if !e.Proxy.ResetLast() {
			t.Fatal("no connection to reset")
		}
	} else {
		e.Proxy.ArmCommit(testenv.CutAtStatement)
		if err := e.Exec(ctxT(t), tx, "INSERT INTO "+w+" (id, v) VALUES (?, ?)", 2, 2); err == nil {
			t.Fatal("a statement through a cut connection succeeded")
		}
		if e.Proxy.Hits() != 1 {
			t.Fatalf("the proxy cut %d statements, want 1", e.Proxy.Hits())
		}
	}
	err := e.Tr.Commit(ctxT(t), tx)
	if err == nil {
		t.Fatal("Commit on a lost connection succeeded")
	}
	if errors.Is(err, dedup.ErrCommitUnknown) {
		t.Fatalf("Commit with no COMMIT sent: %v, want a known failure (not ErrCommitUnknown)", err)
	}
	testenv.Eventually(t, 10*time.Second, "the server to roll the cut transaction back", func() bool {
		_, ok := lookup(t, e, m)
		return !ok
	})
	if n := count(t, e, "SELECT count(*) FROM "+w); n != 0 {
		t.Fatalf("%d effect rows of a transaction never committed", n)
	}
	redeliver(t, e, m, false)
}

func (s suite[T]) commitRejected(t *testing.T) {
	e := s.env(t, Opts{Proxied: s.h.Dialect != SQLite, OneConn: true})
	m := marker("h", "k", "", time.Hour)
	var w string
	switch s.h.Dialect {
	case Postgres:
		w = workTable(t, e, ", CONSTRAINT "+e.Table+"_wv UNIQUE (v) DEFERRABLE INITIALLY DEFERRED")
	case SQLite:
		w = e.Table + "_w"
		DropTable(t, e, w)
		if err := e.DBExec(ctxT(t), "CREATE TABLE "+w+" (id INTEGER PRIMARY KEY, v INTEGER REFERENCES "+w+"(id) DEFERRABLE INITIALLY DEFERRED)"); err != nil {
			t.Fatal(err)
		}
	default:
		w = workTable(t, e, "")
	}
	tx, _ := begin(t, e, m)
	ctx := ctxT(t)
	switch s.h.Dialect {
	case Postgres: // two equal v: the deferred unique constraint fails at COMMIT
		if err := e.Exec(ctx, tx, "INSERT INTO "+w+" (id, v) VALUES (1, 7), (2, 7)"); err != nil {
			t.Fatal(err)
		}
	case SQLite: // a dangling reference: the deferred foreign key fails at COMMIT
		if err := e.Exec(ctx, tx, "INSERT INTO "+w+" (id, v) VALUES (1, 99)"); err != nil {
			t.Fatal(err)
		}
	default: // InnoDB refuses no COMMIT by itself; the proxy plays the server's refusal
		if err := e.Exec(ctx, tx, "INSERT INTO "+w+" (id, v) VALUES (1, 7)"); err != nil {
			t.Fatal(err)
		}
		e.Proxy.ArmCommit(testenv.RejectCommit)
	}
	err := e.Tr.Commit(ctx, tx)
	if err == nil {
		t.Fatal("Commit succeeded; the test's refusal did not happen")
	}
	if errors.Is(err, dedup.ErrCommitUnknown) {
		t.Fatalf("a COMMIT the server refused: %v, want a known failure (not ErrCommitUnknown)", err)
	}
	if _, ok := lookup(t, e, m); ok {
		t.Fatal("the marker of a refused commit is in the table")
	}
	if n := count(t, e, "SELECT count(*) FROM "+w); n != 0 {
		t.Fatalf("%d effect rows of a refused commit", n)
	}
	// The pool's one connection is the refused transaction's: it must be ready for
	// the next run (SQLite keeps a transaction open after a refused COMMIT).
	tx, found := begin(t, e, m)
	if found[0].Found {
		t.Fatal("the next run found the refused run's marker")
	}
	commit(t, e, tx)
	if _, ok := lookup(t, e, m); !ok {
		t.Fatal("the next run's marker is missing")
	}
}

func (s suite[T]) sweep(t *testing.T) {
	e := s.env(t, Opts{})
	var expired, kept []dedup.Marker
	for i := range 25 {
		expired = append(expired, marker("h", fmt.Sprint("old-", i), "", short))
	}
	for i := range 10 {
		kept = append(kept, marker("h", fmt.Sprint("new-", i), "", time.Hour))
	}
	tx, _ := begin(t, e, append(append([]dedup.Marker{}, expired...), kept...)...)
	commit(t, e, tx)
	waitExpired(t, e, expired[0])
	ctx := ctxT(t)
	if _, err := e.Sweep(ctx, 0); err == nil {
		t.Fatal("Sweep with batch 0 succeeded")
	}
	n, err := e.SweepOnce(ctx, 10)
	if err != nil || n != 10 {
		t.Fatalf("one sweep statement of batch 10 deleted %d (%v), want 10", n, err)
	}
	n, err = e.Sweep(ctx, 10)
	if err != nil || n != 15 {
		t.Fatalf("Sweep deleted %d (%v), want the 15 expired left", n, err)
	}
	if n, err := e.Sweep(ctx, 10); err != nil || n != 0 {
		t.Fatalf("Sweep of a swept table deleted %d (%v)", n, err)
	}
	for _, m := range expired {
		if _, ok := lookup(t, e, m); ok {
			t.Fatal("an expired marker survived the sweep")
		}
	}
	for _, m := range kept {
		if _, ok := lookup(t, e, m); !ok {
			t.Fatal("the sweep deleted an unexpired marker")
		}
	}
}

// sweepSparesTakenOver: a marker a Begin is taking over while a sweep runs is not
// deleted, whichever commits first.
func (s suite[T]) sweepSparesTakenOver(t *testing.T) {
	e := s.env(t, Opts{})
	m := marker("h", "k", "", short)
	tx, _ := begin(t, e, m)
	commit(t, e, tx)
	waitExpired(t, e, m)
	again := m
	again.Owner, again.Retention = owner(), time.Hour
	tx, found := begin(t, e, again)
	if found[0].Found {
		t.Fatal("expired marker found")
	}
	swept := make(chan error, 1)
	go func() {
		_, err := e.Sweep(context.Background(), 10)
		swept <- err
	}()
	time.Sleep(200 * time.Millisecond) // the sweep runs, or waits behind tx's locks
	commit(t, e, tx)
	if err := <-swept; err != nil {
		t.Fatal(err)
	}
	if info, ok := lookup(t, e, m); !ok || info.Owner != again.Owner {
		t.Fatalf("the taken-over marker: %+v found=%v, want owner %s", info, ok, again.Owner)
	}
}

func (s suite[T]) sweeperClose(t *testing.T) {
	e := s.env(t, Opts{SweepEvery: 20 * time.Millisecond, SweepBatch: 5})
	write := func(prefix string) []dedup.Marker {
		var ms []dedup.Marker
		for i := range 12 {
			ms = append(ms, marker("h", fmt.Sprint(prefix, i), "", time.Millisecond))
		}
		tx, _ := begin(t, e, ms...)
		commit(t, e, tx)
		return ms
	}
	write("a-")
	testenv.Eventually(t, 10*time.Second, "the sweeper to delete the expired markers", func() bool {
		return count(t, e, "SELECT count(*) FROM "+e.Table) == 0
	})
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	ms := write("b-")
	waitExpired(t, e, ms[0])
	time.Sleep(200 * time.Millisecond) // ten periods
	if n := count(t, e, "SELECT count(*) FROM "+e.Table); n != 12 {
		t.Fatalf("%d of 12 expired markers left after Close: the sweeper still runs", n)
	}
}

func (s suite[T]) tableInjection(t *testing.T) {
	for _, name := range []string{"x; DROP TABLE y", `a"b`, "a`b", "a'b", "", "1abc", "a.b.c", "a b", "a-b",
		"a.", ".a", "x--", "é", "a\x00b", strings.Repeat("a", 49)} {
		err := s.h.NewWithTable(t, name)
		if !errors.Is(err, dedup.ErrInvalidOption) {
			t.Errorf("WithTable(%q): %v, want an error wrapping ErrInvalidOption", name, err)
		}
	}
	if err := s.h.NewWithTable(t, "Order_2"); err != nil {
		t.Errorf("WithTable(Order_2): %v", err)
	}
}

func (s suite[T]) schemaQualified(t *testing.T) {
	e := s.env(t, Opts{Table: s.h.Schema + "." + testenv.TableName()})
	m := marker("h", "k", "", time.Hour)
	tx, _ := begin(t, e, m)
	commit(t, e, tx)
	if _, ok := lookup(t, e, m); !ok {
		t.Fatal("marker not found in the schema-qualified table")
	}
}

func (s suite[T]) digestOnly(t *testing.T) {
	e := s.env(t, Opts{})
	const raw = "order-4711-the-raw-record-key"
	m := dedup.Marker{Handler: "h", Digest: dedup.RecordDigest(raw), Fingerprint: "fp", Owner: owner(), Retention: time.Hour}
	tx, _ := begin(t, e, m)
	commit(t, e, tx)
	if n := count(t, e, "SELECT count(*) FROM "+e.Table+" WHERE key_hash = ?", m.Digest[:]); n != 1 {
		t.Fatalf("%d rows hold the digest as key_hash, want 1", n)
	}
	// Every column of every row, as text: none holds the raw key.
	for _, col := range []string{"handler", "key_hash", "fingerprint", "owner", "expires_at"} {
		if n := count(t, e, "SELECT count(*) FROM "+e.Table+" WHERE "+castText(s.h.Dialect, col)+" LIKE ?", "%"+raw+"%"); n != 0 {
			t.Fatalf("column %s holds the raw key", col)
		}
	}
	if bytes.Contains([]byte(e.Schema()), []byte(raw)) {
		t.Fatal("schema holds the raw key")
	}
}

func castText(d Dialect, col string) string {
	switch d {
	case Postgres:
		return "CAST(" + col + " AS TEXT)"
	case MySQL:
		return "CAST(" + col + " AS CHAR)"
	}
	return "CAST(" + col + " AS TEXT)"
}

func (s suite[T]) schemaMigrate(t *testing.T) {
	e := s.env(t, Opts{NoMigrate: true})
	schema := e.Schema()
	name := e.Table
	for _, want := range []string{name, "IF NOT EXISTS", "PRIMARY KEY (handler, key_hash)", "expires_at"} {
		if !strings.Contains(schema, want) {
			t.Fatalf("Schema lacks %q:\n%s", want, schema)
		}
	}
	ctx := ctxT(t)
	for range 2 {
		if err := e.Migrate(ctx); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
	}
	m := marker("h", "k", "", time.Hour)
	tx, _ := begin(t, e, m)
	commit(t, e, tx)
}

func (s suite[T]) beginValidation(t *testing.T) {
	e := s.env(t, Opts{})
	ok := marker("h", "k", "", time.Hour)
	dup := ok
	dup.Owner = owner()
	bad := func(f func(*dedup.Marker)) dedup.Marker {
		m := marker("h", "k2", "", time.Hour)
		f(&m)
		return m
	}
	for name, ms := range map[string][]dedup.Marker{
		"none":             nil,
		"duplicate":        {ok, dup},
		"empty handler":    {bad(func(m *dedup.Marker) { m.Handler = "" })},
		"long handler":     {bad(func(m *dedup.Marker) { m.Handler = strings.Repeat("h", 65) })},
		"long fingerprint": {bad(func(m *dedup.Marker) { m.Fingerprint = strings.Repeat("f", 33) })},
		"empty owner":      {bad(func(m *dedup.Marker) { m.Owner = "" })},
		"long owner":       {bad(func(m *dedup.Marker) { m.Owner = strings.Repeat("o", 65) })},
		"zero retention":   {bad(func(m *dedup.Marker) { m.Retention = 0 })},
		"NUL in handler":   {bad(func(m *dedup.Marker) { m.Handler = "a\x00b" })},
		"bad UTF-8":        {bad(func(m *dedup.Marker) { m.Fingerprint = "\xff" })},
	} {
		if tx, _, err := e.Tr.Begin(ctxT(t), ms); err == nil {
			_ = e.Tr.Rollback(ctxT(t), tx)
			t.Errorf("%s: Begin succeeded", name)
		}
	}
	if n := e.InUse(); n != 0 {
		t.Fatalf("%d connections in use after refused Begins", n)
	}
	// The limits themselves are accepted.
	m := marker(strings.Repeat("h", 64), "k3", strings.Repeat("f", 32), time.Hour)
	m.Owner = strings.Repeat("o", 64)
	tx, _ := begin(t, e, m)
	commit(t, e, tx)
}

func (s suite[T]) beginErrorNoTx(t *testing.T) {
	e := s.env(t, Opts{NoMigrate: true}) // no table: the insert fails
	if tx, _, err := e.Tr.Begin(ctxT(t), []dedup.Marker{marker("h", "k", "", time.Hour)}); err == nil {
		_ = e.Tr.Rollback(ctxT(t), tx)
		t.Fatal("Begin on a missing table succeeded")
	}
	testenv.Eventually(t, 5*time.Second, "no connection in use", func() bool { return e.InUse() == 0 })
}
