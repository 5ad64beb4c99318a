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

	// closedLO is the large objects API of an ended transaction, whose every
	// operation fails with pgx.ErrTxClosed: what LargeObjects returns once a
	// transaction has ended (conntx.go). Made by the first Begin.
	mu       sync.Mutex
	closedLO pgx.LargeObjects
	haveLO   bool
}

var _ dedup.Transactor[pgx.Tx] = (*Transactor)(nil)

// New returns a Transactor for pool. It does not create the table: see Schema and
// Migrate. With WithSweep it starts the sweeper goroutine, which Close stops. A nil
// pool or a bad option is an error wrapping dedup.ErrInvalidOption.
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

// Schema returns the statements that create the marker table and its expiry index,
// each ended by ';' (Migrate runs them). Columns: handler (the handler's name, at
// most 64 bytes), key_hash (the 32-byte SHA-256 digest of the record key: the key
// itself is never stored), fingerprint (at most 32 bytes, empty for none), owner (the
// run's token, at most 64 bytes) and expires_at (TIMESTAMPTZ, by the database's
// clock). The primary key is (handler, key_hash); the index on expires_at serves
// Sweep.
func (t *Transactor) Schema() string { return t.table.SchemaText() }

// Migrate creates the marker table and its index unless they exist (Schema). It is
// idempotent, but two Migrates racing can fail on PostgreSQL's catalog unique index:
// run it from one place (start-up, a migration job).
func (t *Transactor) Migrate(ctx context.Context) error {
	for _, s := range t.table.Schema() {
		if _, err := t.pool.Exec(ctx, s); err != nil {
			return fmt.Errorf("pgxtx: migrate: %w", err)
		}
	}
	return nil
}

// Close stops the sweeper goroutine, if WithSweep started one, and waits for it to
// end (a sweep in flight is cancelled). It does not close the pool, nor end open
// transactions. It is safe to call more than once, and always returns nil.
func (t *Transactor) Close() error {
	if t.sweeper != nil {
		t.sweeper.Stop()
	}
	return nil
}

// savepoint is the one savepoint name Savepoint sets; pgx's own nested
// transactions (tx.Begin) use sp_1, sp_2, ….
const savepoint = "dedup_item"

// Begin opens a transaction and writes markers in it (dedup.Transactor): each is
// inserted, or takes the place of an expired marker (by the database's clock), and
// an unexpired one, committed by an earlier run, is left alone and reported Found
// with its fingerprint. found[i] is markers[i]'s. The markers are written by one
// multi-row INSERT … ON CONFLICT DO UPDATE … WHERE expired … RETURNING per 1000
// markers (in (handler, digest) order, so that two Begins sharing markers wait for
// each other rather than deadlock); a SELECT of the found markers' fingerprints
// follows only when some were found.
//
// BEGIN and the first INSERT go out together, in one round trip (a pgx batch on a
// connection acquired from the pool), so that a transactional run costs the round
// trips of a plain one-statement transaction: BEGIN+marker, the handler's
// statement, COMMIT. BenchmarkTx measures the round trip saved: on loopback it is
// within the noise of a loaded two-core machine or worth up to a quarter of the
// transaction, and through 500 µs of added round trip the run with BEGIN sent
// apart costs about a third more. The pgx.Tx returned is therefore pgxtx's own
// (conntx.go), with pgx's semantics: pgx makes its own only by sending BEGIN and
// waiting for it.
//
// A marker another transaction holds uncommitted makes Begin wait for that
// transaction (the primary key's row lock), then find the marker if it committed,
// or write it if it rolled back.
//
// ctx bounds Begin's statements; the transaction outlives it, until Commit or
// Rollback. The markers' rules are sqltx.Transactor.Begin's: a handler of 1 to 64
// bytes, a fingerprint of at most 32, an owner token of 1 to 64 (the run's own:
// RollbackTo deletes by it), a positive retention, no two markers for one handler
// and digest. On an error no transaction is left open.
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

// RollbackTo undoes tx's work since the last Savepoint (ROLLBACK TO SAVEPOINT
// dedup_item, which also recovers a transaction a failed statement aborted) and
// deletes m's marker, matched by handler, digest and owner: only a marker this run
// wrote, never one Begin found. Committed, the transaction then leaves m's message
// unprocessed.
func (t *Transactor) RollbackTo(ctx context.Context, tx pgx.Tx, m dedup.Marker) error {
	if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+savepoint); err != nil {
		return fmt.Errorf("pgxtx: rollback to savepoint: %w", err)
	}
	if _, err := tx.Exec(ctx, t.table.DeleteMarker(), m.Handler, m.Digest[:], m.Owner); err != nil {
		return fmt.Errorf("pgxtx: delete marker: %w", err)
	}
	return nil
}

// Commit commits tx; ctx bounds the COMMIT (ending it mid-commit makes the outcome
// unknown), and a ctx already ended rolls tx back instead (the error wraps ctx's).
// An error wraps dedup.ErrCommitUnknown when the COMMIT may have reached the server:
// it was written, and the connection was lost before the answer, or the server
// answered that it was going away (SQLSTATE classes 08, 57, 58 and XX, and 40003).
// Any other error means tx is rolled back: a COMMIT never sent (the connection was
// already closed, or pgconn reports it safe to retry: its write failed with
// nothing written), an error response (a deferred constraint, a serialization
// failure), or a COMMIT of an aborted transaction answered ROLLBACK
// (pgx.ErrTxCommitRollback).
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

// commitUnknown tells whether a COMMIT that failed with err may have reached the
// server; closed: the connection was closed before the COMMIT started.
//
// pgconn refuses a closed connection before it writes anything, and its
// SafeToRetry reports a failure before any byte was written: either way no COMMIT
// was sent. One exception (pgx v5.12): when the read of the COMMIT's reply fails,
// MultiResultReader.NextResult drops the read's error (peekMessage has marked the
// connection closed) and returns the next call's lock error instead, "conn
// closed" (pgconn.ErrConnClosed), which SafeToRetry calls safe although the
// COMMIT was written. On a connection open when the COMMIT started, that error
// means closed during it: unknown. (So is a reply lost to the deallocation of
// invalidated statements pgx sends ahead of the COMMIT: cautious, and rare.)
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

// Rollback rolls tx back. A tx already ended (committed, rolled back) is not an
// error, so that a Rollback after a failed Commit is harmless. It runs even when
// ctx has ended, bounded by 5 s: a rollback cut short would cost the pool its
// connection.
func (t *Transactor) Rollback(ctx context.Context, tx pgx.Tx) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if err := tx.Rollback(rctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("pgxtx: rollback: %w", err)
	}
	return nil
}
