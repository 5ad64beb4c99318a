package sqltx

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
)

type stateErr string

func (e stateErr) Error() string    { return "server error " + string(e) }
func (e stateErr) SQLState() string { return string(e) }

type codeErr int

func (e codeErr) Error() string { return fmt.Sprint("sqlite error ", int(e)) }
func (e codeErr) Code() int     { return int(e) }

// safeErr is an error with pgconn's SafeToRetry method.
type safeErr struct {
	retry bool
	err   error
}

func (e safeErr) Error() string     { return fmt.Sprint("driver error: ", e.err) }
func (e safeErr) SafeToRetry() bool { return e.retry }
func (e safeErr) Unwrap() error     { return e.err }

// The verdicts that need no round trip; the rest (undecided) is settled by asking
// the connection, which the conformance suite's proxy tests cover.
func TestClassifyDecidesCommitVerdictsWithoutARoundTrip(t *testing.T) {
	pg := &Transactor{dialect: PostgreSQL}
	lite := &Transactor{dialect: SQLite}
	reset := &net.OpError{Op: "write", Err: os.NewSyscallError("write", syscall.ECONNRESET)}
	for _, c := range []struct {
		tr     *Transactor
		err    error
		closed bool // the connection was closed before the COMMIT
		want   verdict
	}{
		{pg, sql.ErrTxDone, false, known},
		{pg, fmt.Errorf("wrapped: %w", driver.ErrBadConn), false, known}, // the driver wrote nothing
		{pg, io.EOF, false, unknown},
		{pg, fmt.Errorf("read: %w", io.ErrUnexpectedEOF), false, unknown},
		{pg, &net.OpError{Op: "read", Err: syscall.ECONNRESET}, false, unknown},
		{pg, syscall.EPIPE, false, unknown},
		{pg, stateErr("23505"), false, known},   // deferred unique constraint
		{pg, stateErr("40001"), false, known},   // serialization failure
		{pg, stateErr("57P01"), false, unknown}, // admin shutdown
		{pg, stateErr("08006"), false, unknown}, // connection failure
		{pg, stateErr("XX000"), false, unknown},
		{pg, stateErr("40003"), false, unknown}, // statement completion unknown
		{pg, codeErr(19), false, undecided},     // Code() means nothing outside SQLite
		{lite, codeErr(19), false, known},       // CONSTRAINT
		{lite, codeErr(787), false, known},      // CONSTRAINT_FOREIGNKEY
		{lite, codeErr(5), false, known},        // BUSY
		{lite, codeErr(10), false, unknown},     // IOERR
		{lite, codeErr(266), false, unknown},    // IOERR_READ
		{lite, codeErr(11), false, unknown},     // CORRUPT
		{pg, errors.New("invalid connection"), false, undecided},
		// pgconn: the COMMIT's write failed with nothing written.
		{pg, safeErr{true, reset}, false, known},
		{pg, fmt.Errorf("failed to deallocate cached statement(s): %w", safeErr{true, reset}), false, known},
		// pgconn: refused for a context ended before anything was sent.
		{pg, safeErr{true, context.Canceled}, false, known},
		// pgconn's "conn closed" on a connection open before the COMMIT: the reply
		// was lost after the COMMIT was written. It names no failure.
		{pg, safeErr{true, errors.New("conn closed")}, false, undecided},
		{pg, safeErr{false, io.ErrUnexpectedEOF}, false, unknown},
		// The connection was closed before the COMMIT: nothing was sent, whatever
		// the driver says (mysql's ErrInvalidConn, pgconn's "conn closed").
		{pg, errors.New("invalid connection"), true, known},
		{pg, safeErr{true, errors.New("conn closed")}, true, known},
		{pg, io.ErrUnexpectedEOF, true, known},
	} {
		if got := c.tr.classify(c.err, c.closed); got != c.want {
			t.Errorf("%v on %v (closed before: %v): verdict %d, want %d", c.err, c.tr.dialect, c.closed, got, c.want)
		}
	}
}

type validator struct{ valid bool }

func (v validator) IsValid() bool { return v.valid }

type pgxLike struct{ c *closer }

func (p pgxLike) Conn() *closer { return p.c }

type closer struct{ closed bool }

func (c *closer) IsClosed() bool { return c.closed }

// closedBefore's reading of driver connections: a Validator's answer, or the
// IsClosed of the connection a Conn method returns (pgx's stdlib).
func TestDriverConnClosedAsksAValidatorOrIsClosed(t *testing.T) {
	for _, c := range []struct {
		dc   any
		want bool
	}{
		{validator{true}, false},
		{validator{false}, true},
		{pgxLike{&closer{false}}, false},
		{pgxLike{&closer{true}}, true},
		{pgxLike{nil}, false},
		{struct{}{}, false},
	} {
		if got := driverConnClosed(c.dc); got != c.want {
			t.Errorf("%#v: closed %v, want %v", c.dc, got, c.want)
		}
	}
}
