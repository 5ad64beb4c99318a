package pgxtx

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/internal/markersql"
)

// Transactor runs transactional handlers' transactions on a pgx pool, with their
// runs' markers in a table of that database. It implements dedup.Transactor for
// pgx.Tx. Safe for concurrent use; Close stops its sweeper.
type Transactor struct {
	pool      *pgxpool.Pool
	table     markersql.Table
	beginSQL  string
	commitSQL string
	sweeper   *markersql.Sweeper // nil without WithSweep

	// closedLO is the large objects API of an ended transaction (every operation
	// fails with pgx.ErrTxClosed), which connTx.LargeObjects returns once its
	// transaction has ended. Made by the first Begin.
	mu       sync.Mutex
	closedLO pgx.LargeObjects
	haveLO   bool
}

var _ dedup.Transactor[pgx.Tx] = (*Transactor)(nil)

// New returns a Transactor for pool. It does not create the table (see Schema
// and Migrate). A nil pool or a bad option returns an error wrapping
// dedup.ErrInvalidOption.
func New(pool *pgxpool.Pool, opts ...Option) (*Transactor, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pgxtx: pool is nil", dedup.ErrInvalidOption)
	}
	c := defaults()
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("pgxtx: %w: nil Option", dedup.ErrInvalidOption)
		}
		if err := o(&c); err != nil {
			return nil, fmt.Errorf("pgxtx: %w", err)
		}
	}
	table, err := markersql.NewTable(markersql.Postgres, c.table)
	if err != nil { // validated by WithTable, or the default
		return nil, fmt.Errorf("%w: pgxtx: %w", dedup.ErrInvalidOption, err)
	}
	t := &Transactor{pool: pool, table: table, beginSQL: beginSQL(c.txOpts), commitSQL: "commit"}
	if c.txOpts.CommitQuery != "" {
		t.commitSQL = c.txOpts.CommitQuery
	}
	if c.sweepEvery > 0 {
		t.sweeper = markersql.StartSweeper(c.sweepEvery, c.sweepBatch, t.Sweep, c.logger, "pgxtx")
	}
	return t, nil
}

// Schema returns the statements, each ended by ';', that create the marker table
// (handler, key_hash, fingerprint, owner, expires_at; primary key handler and
// key_hash) and its expiry index.
func (t *Transactor) Schema() string { return t.table.SchemaText() }

// Migrate creates the marker table and its index unless they exist (Schema).
// Run it from one place: two Migrates racing can fail.
func (t *Transactor) Migrate(ctx context.Context) error {
	for _, s := range t.table.Schema() {
		if _, err := t.pool.Exec(ctx, s); err != nil {
			return fmt.Errorf("pgxtx: migrate: %w", err)
		}
	}
	return nil
}

// Close stops the sweeper, if any, and waits for it; a sweep in flight is
// cancelled. It does not close the pool nor end open transactions, may be called
// more than once, and returns nil.
func (t *Transactor) Close() error {
	if t.sweeper != nil {
		t.sweeper.Stop()
	}
	return nil
}

// savepoint is the one savepoint name Savepoint sets; pgx's own nested
// transactions (tx.Begin) use sp_1, sp_2, ….
const savepoint = "dedup_item"

// Begin opens a transaction and writes markers in it. Each is inserted or takes
// an expired marker's place; an unexpired one, committed by an earlier run, is
// left alone and reported Found in found[i]. A marker another transaction holds
// uncommitted makes Begin wait for that transaction. BEGIN goes out with the
// first marker INSERT, in one round trip, so the pgx.Tx returned is pgxtx's own,
// with pgx's semantics. ctx bounds Begin's statements, not the transaction. The
// markers' rules are sqltx.Transactor.Begin's. On an error no transaction is
// left open.
func (t *Transactor) Begin(ctx context.Context, markers []dedup.Marker) (pgx.Tx, []dedup.MarkerState, error) {
	order, err := markersql.CheckMarkers(markers)
	if err != nil {
		return nil, nil, fmt.Errorf("pgxtx: begin: %w", err)
	}
	c, err := t.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("pgxtx: begin: %w", err)
	}
	if err := t.makeClosedLO(ctx, c.Conn()); err != nil {
		c.Release()
		return nil, nil, fmt.Errorf("pgxtx: begin: %w", err)
	}
	tx := &connTx{t: t, c: c, conn: c.Conn(), commitSQL: t.commitSQL}
	begun := false
	found, err := t.table.WriteMarkers(ctx, func(ctx context.Context, query string, args []any, row func(scan func(...any) error) error) error {
		if begun {
			return scanRows(tx.conn.Query(ctx, query, args...))(row)
		}
		begun = true
		b := &pgx.Batch{}
		b.Queue(t.beginSQL)
		b.Queue(query, args...)
		br := tx.conn.SendBatch(ctx, b)
		_, err := br.Exec()
		if err == nil {
			err = scanRows(br.Query())(row)
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return err
	}, markers, order)
	if err != nil {
		tx.abort()
		return nil, nil, fmt.Errorf("pgxtx: begin: %w", err)
	}
	return tx, found, nil
}

// makeClosedLO makes closedLO, once, on conn outside any transaction: pgx's own Tx
// over an empty statement, committed with another (no BEGIN or COMMIT reaches the
// server).
func (t *Transactor) makeClosedLO(ctx context.Context, conn *pgx.Conn) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.haveLO {
		return nil
	}
	d, err := conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: ";", CommitQuery: ";"})
	if err != nil {
		return err
	}
	if err := d.Commit(ctx); err != nil {
		return err
	}
	t.closedLO, t.haveLO = d.LargeObjects(), true
	return nil
}

// scanRows calls row for each of rows, then closes them.
func scanRows(rows pgx.Rows, err error) func(row func(scan func(...any) error) error) error {
	return func(row func(scan func(...any) error) error) error {
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := row(rows.Scan); err != nil {
				return err
			}
		}
		return rows.Err()
	}
}

// Savepoint sets the savepoint the next RollbackTo returns to (SAVEPOINT
// dedup_item). Each call sets a new one; PostgreSQL stacks savepoints of one name.
func (t *Transactor) Savepoint(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, "SAVEPOINT "+savepoint); err != nil {
		return fmt.Errorf("pgxtx: savepoint: %w", err)
	}
	return nil
}

// RollbackTo undoes tx's work since the last Savepoint, recovering a transaction
// a failed statement aborted, and deletes m's marker if this run wrote it, so
// that tx, committed, leaves m's message unprocessed.
func (t *Transactor) RollbackTo(ctx context.Context, tx pgx.Tx, m dedup.Marker) error {
	if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+savepoint); err != nil {
		return fmt.Errorf("pgxtx: rollback to savepoint: %w", err)
	}
	if _, err := tx.Exec(ctx, t.table.DeleteMarker(), m.Handler, m.Digest[:], m.Owner); err != nil {
		return fmt.Errorf("pgxtx: delete marker: %w", err)
	}
	return nil
}

// Commit commits tx, bounded by ctx; a ctx already ended rolls tx back instead.
// The error wraps dedup.ErrCommitUnknown when the COMMIT may have reached the
// server: the connection was lost after it was written (ctx ending mid-commit
// included), or the server answered that it was going away (SQLSTATE classes 08,
// 57, 58, XX, and 40003). Any other error means tx was rolled back.
func (t *Transactor) Commit(ctx context.Context, tx pgx.Tx) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pgxtx: commit not attempted: %w", errors.Join(err, t.Rollback(ctx, tx)))
	}
	closed := tx.Conn() != nil && tx.Conn().IsClosed()
	err := tx.Commit(ctx)
	if err == nil {
		return nil
	}
	if commitUnknown(err, closed) {
		return fmt.Errorf("pgxtx: commit: %w: %w", dedup.ErrCommitUnknown, err)
	}
	return fmt.Errorf("pgxtx: commit: %w", err)
}

// commitUnknown reports whether a COMMIT that failed with err may have reached
// the server; closed: the connection was closed before the COMMIT started.
// pgconn writes nothing on a closed connection, and SafeToRetry means nothing
// was written, except for "conn closed" (pgconn.ErrConnClosed): pgx (v5.12)
// returns it, called safe, when the read of a written COMMIT's reply fails. On a
// connection open before the COMMIT it is therefore unknown (as is, cautiously,
// a reply lost to the statement deallocations pgx sends ahead of the COMMIT).
func commitUnknown(err error, closed bool) bool {
	if closed || errors.Is(err, pgx.ErrTxClosed) || errors.Is(err, pgx.ErrTxCommitRollback) {
		return false // nothing sent, or the server answered ROLLBACK
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return markersql.PostgresCommitUnknown(pgErr.Code)
	}
	if errors.Is(err, pgconn.ErrConnClosed) {
		return true // closed during the COMMIT: its reply was lost
	}
	return !pgconn.SafeToRetry(err)
}

// rollbackTimeout bounds a Rollback, which runs even when the caller's ctx has
// ended (a rollback cut short closes the connection instead).
const rollbackTimeout = 5 * time.Second

// Rollback rolls tx back, even after ctx has ended (within 5 s: a rollback cut
// short costs the pool its connection). A tx already ended is not an error, so
// that a Rollback after a failed Commit is harmless.
func (t *Transactor) Rollback(ctx context.Context, tx pgx.Tx) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if err := tx.Rollback(rctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("pgxtx: rollback: %w", err)
	}
	return nil
}
