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

// verdict classifies a failed COMMIT without importing drivers: known (rolled
// back: refused by the server, or never sent) or unknown (it may have reached
// the server). classify tries, in order:
//
//  1. The connection was closed before the COMMIT (closedBefore): known, as each
//     supported driver refuses a closed connection before writing anything.
//  2. sql.ErrTxDone or driver.ErrBadConn: nothing was sent. Known.
//  3. SafeToRetry() true on a net.Error or an ended context (notSent): known.
//     SafeToRetry alone is not trusted: pgconn also says it of the "conn
//     closed" it returns when the reply to a written COMMIT is lost.
//  4. A lost connection (lostConnection): unknown.
//  5. A SQLState() (pgconn's PgError): known unless the server was going away.
//  6. On SQLite, a Code(): known for a refusal (BUSY, LOCKED, CONSTRAINT, ...;
//     modernc.org/sqlite rolls back a COMMIT refused with BUSY), unknown for I/O
//     and the like.
//  7. Anything else (a MySQL error packet, mysql's ErrInvalidConn, pgconn's
//     "conn closed"): commitError sends a ROLLBACK, a no-op after a failed
//     COMMIT, on the transaction's connection. An answer means the connection
//     survived, so the server answered the COMMIT with an error: known. No
//     answer: unknown. Only a failed COMMIT pays this round trip.
//
// docs/transactional.md has the cases per driver.
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
// driver.Validator answering false (mysql's also does with a result unread, when
// its Commit fails before writing too), or, for pgx's stdlib, which is no
// Validator, IsClosed of the *pgx.Conn its Conn method returns, called by
// reflection so that sqltx imports no pgx. A nil conn is not closed.
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
