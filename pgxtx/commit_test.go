package pgxtx

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dedupkit/dedupkit/internal/testenv"
)

// The errors pgx's own Tx.Commit returns as a proxy loses its connection at each
// point, and commitUnknown's verdict on each. The connection lost after the COMMIT
// was written ("cut before commit": dropped by the proxy; "cut after commit":
// committed, the reply dropped) is unknown although pgconn.SafeToRetry says true:
// NextResult drops the failed read's error, and the next call's "conn closed" (a
// lock error, ErrConnClosed) is what Commit returns. A connection lost before
// (closed by a failed statement, or reset so that the COMMIT's write fails) is a
// known failure.
func TestCommitIsUnknownOnlyWhenTheConnectionIsLostAfterItWasWritten(t *testing.T) {
	u := testenv.PostgresURL(t)
	for _, c := range []struct {
		name    string
		fault   testenv.CommitFault // armed before the COMMIT
		reset   bool                // the connection reset before the COMMIT
		unknown bool
	}{
		{name: "cut at statement", fault: testenv.CutAtStatement},
		{name: "reset before commit", reset: true},
		{name: "cut before commit", fault: testenv.CutBeforeCommit, unknown: true},
		{name: "cut after commit", fault: testenv.CutAfterCommit, unknown: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := testenv.NewSQLProxy(testenv.PostgresWire, testenv.PostgresHost(t, u))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			conn, err := pgx.Connect(ctx, testenv.WithPostgresHost(u, p.Addr()))
			if err != nil {
				testenv.SkipNoServer(t, "PostgreSQL at DEDUP_POSTGRES_URL does not answer: %v", err)
			}
			defer conn.Close(context.Background())
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
				t.Fatal(err)
			}
			switch {
			case c.fault == testenv.CutAtStatement:
				p.ArmCommit(c.fault)
				if _, err := tx.Exec(ctx, "SELECT 2"); err == nil {
					t.Fatal("a statement through a cut connection succeeded")
				}
			case c.reset:
				if !p.ResetLast() {
					t.Fatal("no connection to reset")
				}
			default:
				p.ArmCommit(c.fault)
			}
			closed := conn.IsClosed()
			err = tx.Commit(ctx)
			if err == nil {
				t.Fatal("Commit succeeded")
			}
			t.Logf("closed before COMMIT %v; %v; SafeToRetry %v; ErrConnClosed %v", closed, err,
				pgconn.SafeToRetry(err), errors.Is(err, pgconn.ErrConnClosed))
			if got := commitUnknown(err, closed); got != c.unknown {
				t.Fatalf("commitUnknown = %v, want %v", got, c.unknown)
			}
			if c.fault == testenv.CutAfterCommit && !pgconn.SafeToRetry(err) {
				t.Log("pgconn no longer reports a COMMIT cut after it was written as safe to retry")
			}
		})
	}
}
