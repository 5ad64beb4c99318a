package pgxtx

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// connTx is the pgx.Tx Begin returns: a transaction on a pooled connection whose
// BEGIN went out with the first marker INSERT (pgx makes its own Tx only by
// sending BEGIN and waiting for it). It behaves as pgxpool.Tx: after Commit or
// Rollback every method returns pgx.ErrTxClosed; a COMMIT answered ROLLBACK is
// pgx.ErrTxCommitRollback; a failed Commit or Rollback that leaves the connection
// in a transaction closes it; the connection returns to the pool exactly once.
// Not safe for concurrent use.
type connTx struct {
	t         *Transactor
	c         *pgxpool.Conn // nil once released
	conn      *pgx.Conn
	commitSQL string
	closed    bool
	nested    int64 // savepoints made by Begin, numbering their names

	// attached is pgx's own Tx over this same transaction, made by the first
	// LargeObjects: pgx.LargeObjects can only be made by pgx's Tx types (its one
	// field is unexported). Once it exists, Commit and Rollback go through it, so
	// that its large objects see the transaction end as pgx's do.
	attached pgx.Tx
}

var _ pgx.Tx = (*connTx)(nil)

// beginSQL is pgx's BEGIN for opts (TxOptions.beginSQL is unexported); the values
// are pgx's constants, checked by WithTxOptions.
func beginSQL(opts pgx.TxOptions) string {
	if opts.BeginQuery != "" {
		return opts.BeginQuery
	}
	var b strings.Builder
	b.WriteString("begin")
	if opts.IsoLevel != "" {
		b.WriteString(" isolation level " + string(opts.IsoLevel))
	}
	if opts.AccessMode != "" {
		b.WriteString(" " + string(opts.AccessMode))
	}
	if opts.DeferrableMode != "" {
		b.WriteString(" " + string(opts.DeferrableMode))
	}
	return b.String()
}

// endTimeout bounds the ROLLBACK that cleans up after a failed Begin.
const endTimeout = 5 * time.Second

// abort ends a transaction Begin could not complete and gives the connection back:
// rolled back if it can be, closed if not (the server then ends the transaction).
func (tx *connTx) abort() {
	tx.closed = true
	if !tx.conn.IsClosed() && tx.conn.PgConn().TxStatus() != 'I' {
		ctx, cancel := context.WithTimeout(context.Background(), endTimeout)
		if _, err := tx.conn.Exec(ctx, "rollback"); err != nil {
			_ = tx.conn.Close(ctx)
		}
		cancel()
	}
	tx.release()
}

func (tx *connTx) release() {
	if tx.c != nil {
		tx.c.Release() // the pool destroys a connection closed or still in a transaction
		tx.c = nil
	}
}

// Begin starts a pseudo nested transaction (a savepoint), as pgx's does.
func (tx *connTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if tx.closed {
		return nil, pgx.ErrTxClosed
	}
	tx.nested++
	// Not pgx's sp_N: the attached Tx numbers its own savepoints so.
	name := "dedup_sp_" + strconv.FormatInt(tx.nested, 10)
	if _, err := tx.conn.Exec(ctx, "savepoint "+name); err != nil {
		return nil, err
	}
	return &savepointTx{root: tx, name: name}, nil
}

// Commit commits the transaction and returns the connection to the pool.
func (tx *connTx) Commit(ctx context.Context) error {
	if tx.closed {
		return pgx.ErrTxClosed
	}
	tx.closed = true
	defer tx.release()
	if tx.attached != nil {
		return tx.attached.Commit(ctx)
	}
	tag, err := tx.conn.Exec(ctx, tx.commitSQL)
	if err != nil {
		if tx.conn.PgConn().TxStatus() != 'I' {
			_ = tx.conn.Close(ctx) // already have an error to return
		}
		return err
	}
	if tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return nil
}

// Rollback rolls the transaction back and returns the connection to the pool; a
// failed rollback closes the connection. It returns pgx.ErrTxClosed once the
// transaction has ended, so a deferred Rollback after Commit is harmless.
func (tx *connTx) Rollback(ctx context.Context) error {
	if tx.closed {
		return pgx.ErrTxClosed
	}
	tx.closed = true
	defer tx.release()
	if tx.attached != nil {
		return tx.attached.Rollback(ctx)
	}
	if _, err := tx.conn.Exec(ctx, "rollback"); err != nil {
		_ = tx.conn.Close(ctx) // a rollback failure leaves the connection in an undefined state
		return err
	}
	return nil
}

// Exec runs a statement in the transaction.
func (tx *connTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if tx.closed {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return tx.conn.Exec(ctx, sql, args...)
}

// Query runs a query in the transaction; after the end, the Rows carry
// pgx.ErrTxClosed too, so that the error may be checked on them.
func (tx *connTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if tx.closed {
		return errRows{err: pgx.ErrTxClosed}, pgx.ErrTxClosed
	}
	return tx.conn.Query(ctx, sql, args...)
}

// QueryRow runs a query returning at most one row in the transaction.
func (tx *connTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if tx.closed {
		return errRows{err: pgx.ErrTxClosed}
	}
	return tx.conn.QueryRow(ctx, sql, args...)
}

// SendBatch sends a batch in the transaction.
func (tx *connTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if tx.closed {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	return tx.conn.SendBatch(ctx, b)
}

// CopyFrom copies rows into a table in the transaction.
func (tx *connTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if tx.closed {
		return 0, pgx.ErrTxClosed
	}
	return tx.conn.CopyFrom(ctx, table, columns, src)
}

// Prepare prepares a statement on the transaction's connection.
func (tx *connTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if tx.closed {
		return nil, pgx.ErrTxClosed
	}
	return tx.conn.Prepare(ctx, name, sql)
}

// attachTimeout bounds the round trip of the first LargeObjects, which has no
// context.
const attachTimeout = 30 * time.Second

// LargeObjects returns the large objects API of the transaction. The first call
// costs one round trip (an empty statement, which makes pgx's own Tx over this
// transaction); once the transaction has ended, or its connection is lost, every
// operation fails with pgx.ErrTxClosed.
func (tx *connTx) LargeObjects() pgx.LargeObjects {
	if tx.closed {
		return tx.t.closedLO
	}
	if tx.attached == nil {
		ctx, cancel := context.WithTimeout(context.Background(), attachTimeout)
		defer cancel()
		a, err := tx.conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: ";", CommitQuery: tx.commitSQL})
		if err != nil {
			return tx.t.closedLO // the connection is lost: so is the transaction
		}
		tx.attached = a
	}
	return tx.attached.LargeObjects()
}

// Conn returns the transaction's connection.
func (tx *connTx) Conn() *pgx.Conn { return tx.conn }

// savepointTx is a pseudo nested transaction of a connTx, as pgx's own.
type savepointTx struct {
	root   *connTx
	name   string
	closed bool
}

var _ pgx.Tx = (*savepointTx)(nil)

func (sp *savepointTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if sp.closed {
		return nil, pgx.ErrTxClosed
	}
	return sp.root.Begin(ctx)
}

// Commit releases the savepoint.
func (sp *savepointTx) Commit(ctx context.Context) error {
	if sp.closed {
		return pgx.ErrTxClosed
	}
	_, err := sp.Exec(ctx, "release savepoint "+sp.name)
	sp.closed = true
	return err
}

// Rollback rolls back to the savepoint.
func (sp *savepointTx) Rollback(ctx context.Context) error {
	if sp.closed {
		return pgx.ErrTxClosed
	}
	_, err := sp.Exec(ctx, "rollback to savepoint "+sp.name)
	sp.closed = true
	return err
}

func (sp *savepointTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if sp.closed {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return sp.root.Exec(ctx, sql, args...)
}

func (sp *savepointTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if sp.closed {
		return errRows{err: pgx.ErrTxClosed}, pgx.ErrTxClosed
	}
	return sp.root.Query(ctx, sql, args...)
}

func (sp *savepointTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if sp.closed {
		return errRows{err: pgx.ErrTxClosed}
	}
	return sp.root.QueryRow(ctx, sql, args...)
}

func (sp *savepointTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if sp.closed {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	return sp.root.SendBatch(ctx, b)
}

func (sp *savepointTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if sp.closed {
		return 0, pgx.ErrTxClosed
	}
	return sp.root.CopyFrom(ctx, table, columns, src)
}

func (sp *savepointTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if sp.closed {
		return nil, pgx.ErrTxClosed
	}
	return sp.root.Prepare(ctx, name, sql)
}

// LargeObjects returns the root transaction's: valid until it ends (pgx's nested
// ones end with the savepoint).
func (sp *savepointTx) LargeObjects() pgx.LargeObjects { return sp.root.LargeObjects() }

func (sp *savepointTx) Conn() *pgx.Conn { return sp.root.conn }

// errRows is the Rows and Row of a query on an ended transaction.
type errRows struct{ err error }

func (r errRows) Close()                                       {}
func (r errRows) Err() error                                   { return r.err }
func (r errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r errRows) Next() bool                                   { return false }
func (r errRows) Scan(...any) error                            { return r.err }
func (r errRows) Values() ([]any, error)                       { return nil, r.err }
func (r errRows) RawValues() [][]byte                          { return nil }
func (r errRows) Conn() *pgx.Conn                              { return nil }
func (r errRows) TypeMap() *pgtype.Map                         { return nil }
