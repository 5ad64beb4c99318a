package sqltx

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/internal/markersql"
)

// How a failed COMMIT is told to be unknown or known (rolled back), with no driver
// imported: drivers are the caller's, and their error types cannot be named here.
// The error is read through values and method sets any driver's types can have, in
// this order:
//
//  1. sql.ErrTxDone: database/sql sent nothing. Known.
//  2. A lost connection: driver.ErrBadConn, io.EOF, io.ErrUnexpectedEOF,
//     net.ErrClosed, a net.Error, ECONNRESET, EPIPE, ECONNABORTED, a context error.
//     Unknown: the COMMIT may have reached the server. (driver.ErrBadConn promises
//     that nothing ran, but the promise is the driver's, and unknown costs only a
//     wait for the lease.)
//  3. A SQLState() string method (pgx's *pgconn.PgError, the server's error
//     response): known, unless its class says the server was going away
//     (markersql.PostgresCommitUnknown).
//  4. On SQLite, a Code() int method (modernc.org/sqlite's *sqlite.Error): known for
//     the codes of a refusal (BUSY, LOCKED, CONSTRAINT, …); unknown for I/O,
//     corruption and the like, after which the journal, not the caller, decides.
//  5. Anything else (go-sql-driver's *mysql.MySQLError for a server's error packet
//     has no method to recognize it by, its ErrInvalidConn for a lost connection
//     and pgconn's "conn closed" are plain values): the transaction's own
//     connection is asked, by a ROLLBACK. If it answers, the connection survived
//     the COMMIT, so the server answered the COMMIT, with an error: known. If not,
//     unknown.
//
// pgconn's SafeToRetry() method is not trusted here: a connection cut after the
// COMMIT was written (and committed) makes pgx report "conn closed" with
// SafeToRetry() true, as the proxy test CommitUnknownAfterCommit shows.
//
// The ROLLBACK is a no-op the server answers with OK once a COMMIT failed
// (PostgreSQL adds a warning). It is sent only when the error alone does not
// decide: a failed COMMIT is rare, and the extra round trip is paid then only.
// (SQLite keeps a transaction open after a COMMIT refused with BUSY; modernc.org/sqlite
// rolls it back itself before Commit returns.)
type verdict uint8

const (
	undecided verdict = iota
	known
	unknown
)

func (t *Transactor) classify(err error) verdict {
	if errors.Is(err, sql.ErrTxDone) {
		return known
	}
	if lostConnection(err) {
		return unknown
	}
	var state interface{ SQLState() string }
	if errors.As(err, &state) {
		if markersql.PostgresCommitUnknown(state.SQLState()) {
			return unknown
		}
		return known
	}
	var code interface{ Code() int }
	if t.dialect == SQLite && errors.As(err, &code) {
		switch code.Code() & 0xff { // the primary result code
		case 1, 4, 5, 6, 8, 9, 19: // ERROR, ABORT, BUSY, LOCKED, READONLY, INTERRUPT, CONSTRAINT
			return known
		}
		return unknown
	}
	return undecided
}

func lostConnection(err error) bool {
	for _, target := range []error{driver.ErrBadConn, io.EOF, io.ErrUnexpectedEOF, net.ErrClosed,
		syscall.ECONNRESET, syscall.EPIPE, syscall.ECONNABORTED, context.Canceled, context.DeadlineExceeded} {
		if errors.Is(err, target) {
			return true
		}
	}
	var ne net.Error
	return errors.As(err, &ne)
}

// probeTimeout bounds the ROLLBACK that asks the connection after a failed COMMIT.
const probeTimeout = 5 * time.Second

func (t *Transactor) commitError(ctx context.Context, conn *sql.Conn, err error) error {
	v := t.classify(err)
	if v == undecided {
		v = unknown
		if conn != nil {
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), probeTimeout)
			if _, perr := conn.ExecContext(pctx, "ROLLBACK"); perr == nil {
				v = known
			}
			cancel()
		}
	}
	if v == known {
		return fmt.Errorf("sqltx: commit: %w", err)
	}
	return fmt.Errorf("sqltx: commit: %w: %w", dedup.ErrCommitUnknown, err)
}
