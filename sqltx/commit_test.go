package sqltx

import (
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
)

type stateErr string

func (e stateErr) Error() string    { return "server error " + string(e) }
func (e stateErr) SQLState() string { return string(e) }

type codeErr int

func (e codeErr) Error() string { return fmt.Sprint("sqlite error ", int(e)) }
func (e codeErr) Code() int     { return int(e) }

// The verdicts that need no round trip; the rest (undecided) is settled by asking
// the connection, which the conformance suite's proxy tests cover.
func TestClassify(t *testing.T) {
	pg := &Transactor{dialect: PostgreSQL}
	lite := &Transactor{dialect: SQLite}
	for _, c := range []struct {
		tr   *Transactor
		err  error
		want verdict
	}{
		{pg, sql.ErrTxDone, known},
		{pg, fmt.Errorf("wrapped: %w", driver.ErrBadConn), unknown},
		{pg, io.EOF, unknown},
		{pg, fmt.Errorf("read: %w", io.ErrUnexpectedEOF), unknown},
		{pg, &net.OpError{Op: "read", Err: syscall.ECONNRESET}, unknown},
		{pg, syscall.EPIPE, unknown},
		{pg, stateErr("23505"), known},   // deferred unique constraint
		{pg, stateErr("40001"), known},   // serialization failure
		{pg, stateErr("57P01"), unknown}, // admin shutdown
		{pg, stateErr("08006"), unknown}, // connection failure
		{pg, stateErr("XX000"), unknown},
		{pg, stateErr("40003"), unknown}, // statement completion unknown
		{pg, codeErr(19), undecided},     // Code() means nothing outside SQLite
		{lite, codeErr(19), known},       // CONSTRAINT
		{lite, codeErr(787), known},      // CONSTRAINT_FOREIGNKEY
		{lite, codeErr(5), known},        // BUSY
		{lite, codeErr(10), unknown},     // IOERR
		{lite, codeErr(266), unknown},    // IOERR_READ
		{lite, codeErr(11), unknown},     // CORRUPT
		{pg, errors.New("invalid connection"), undecided},
	} {
		if got := c.tr.classify(c.err); got != c.want {
			t.Errorf("%v on %v: verdict %d, want %d", c.err, c.tr.dialect, got, c.want)
		}
	}
}
