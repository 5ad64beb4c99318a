package sqltx

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"syscall"
	"time"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/internal/markersql"
)

// How a failed COMMIT is told to be unknown or known (rolled back), with no driver
// imported: drivers are the caller's, and their error types cannot be named here.
// Unknown means the COMMIT may have reached the server; a COMMIT the driver never
// sent is a known failure (the server rolls the transaction back with the
// connection). Before the COMMIT, Commit asks the driver connection whether it is
// closed already (closedBefore, no round trip); then the error is read through
// values and method sets any driver's types can have, in this order:
//
//  1. The connection was closed before the COMMIT (a statement of fn lost it, say):
//     known. Each driver refuses a closed connection before it writes anything:
//     go-sql-driver/mysql (whose Commit then returns ErrInvalidConn, as it does for
//     a reply lost after the COMMIT was written), pgx's stdlib ("conn closed"),
//     modernc.org/sqlite.
//  2. sql.ErrTxDone: database/sql sent nothing. Known.
//  3. driver.ErrBadConn: the driver promises that nothing ran (database/sql's
//     contract for it); go-sql-driver/mysql returns it from Commit only when its
//     write of the COMMIT failed with nothing written. Known.
//  4. A SafeToRetry() method reporting true (pgconn's: its write failed with
//     nothing written) on an error that names the failure: a net.Error (the
//     write's) or an ended context. Known. pgconn also says "safe to retry" of its
//     "conn closed", which names none: when the connection was open before the
//     COMMIT (1), that error is the lost reply of a COMMIT written (pgconn's
//     MultiResultReader.NextResult drops the read's error and reports the closed
//     connection it finds next), and the steps below decide.
//  5. A lost connection: io.EOF, io.ErrUnexpectedEOF, net.ErrClosed, a net.Error,
//     ECONNRESET, EPIPE, ECONNABORTED, a context error. Unknown: the COMMIT may
//     have reached the server.
//  6. A SQLState() string method (pgx's *pgconn.PgError, the server's error
//     response): known, unless its class says the server was going away
//     (markersql.PostgresCommitUnknown).
//  7. On SQLite, a Code() int method (modernc.org/sqlite's *sqlite.Error): known for
//     the codes of a refusal (BUSY, LOCKED, CONSTRAINT, …); unknown for I/O,
//     corruption and the like, after which the journal, not the caller, decides.
//  8. Anything else (go-sql-driver's *mysql.MySQLError for a server's error packet
//     has no method to recognize it by, its ErrInvalidConn for a lost connection
//     is a plain value, pgconn's "conn closed" names no failure): the
//     transaction's own connection is asked, by a ROLLBACK. If it answers, the
//     connection survived the COMMIT, so the server answered the COMMIT, with an
//     error: known. If not, unknown.
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

// classify reads a failed COMMIT's err; closed: the driver connection was closed
// before the COMMIT (closedBefore).
func (t *Transactor) classify(err error, closed bool) verdict {
	if closed || errors.Is(err, sql.ErrTxDone) || errors.Is(err, driver.ErrBadConn) || notSent(err) {
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

// notSent reports a driver's SafeToRetry() true on an error naming the failure it
// saw: a net.Error (a write that failed with nothing written) or an ended context.
func notSent(err error) bool {
	var retry interface{ SafeToRetry() bool }
	if !errors.As(err, &retry) || !retry.SafeToRetry() {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// closedBefore reports whether conn's driver connection is closed already: a
// driver.Validator answering false (go-sql-driver/mysql, modernc.org/sqlite; mysql
// also answers false with a result still unread, when its Commit fails before
// writing too), or, for pgx's stdlib, whose connection is no Validator, the
// *pgx.Conn its Conn method returns reporting IsClosed. That method is called by
// reflection, so that sqltx does not import pgx. conn nil: false.
func closedBefore(conn *sql.Conn) bool {
	if conn == nil {
		return false
	}
	closed := false
	_ = conn.Raw(func(dc any) error {
		closed = driverConnClosed(dc)
		return nil
	})
	return closed
}

func driverConnClosed(dc any) bool {
	if v, ok := dc.(driver.Validator); ok {
		return !v.IsValid()
	}
	m := reflect.ValueOf(dc).MethodByName("Conn")
	if !m.IsValid() || m.Type().NumIn() != 0 || m.Type().NumOut() != 1 {
		return false
	}
	c := m.Call(nil)[0]
	if c.Kind() == reflect.Pointer && c.IsNil() {
		return false
	}
	ic, ok := c.Interface().(interface{ IsClosed() bool })
	return ok && ic.IsClosed()
}

func lostConnection(err error) bool {
	for _, target := range []error{io.EOF, io.ErrUnexpectedEOF, net.ErrClosed,
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

// commitError is Commit's error for a COMMIT that failed with err on conn (nil if
// unknown); closed: conn was closed before the COMMIT.
func (t *Transactor) commitError(ctx context.Context, conn *sql.Conn, err error, closed bool) error {
	v := t.classify(err, closed)
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
