package sqltx

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/internal/markersql"
)

// savepoint is the one savepoint name Savepoint sets: RollbackTo returns to the
// latest, and an item's fn that sets savepoints of its own uses other names.
const savepoint = "dedup_item"

// Begin opens a transaction and writes markers in it. Each is inserted or takes
// an expired marker's place; an unexpired one, committed by an earlier run, is
// left alone and reported Found in found[i]. A marker another transaction holds
// uncommitted makes Begin wait for that transaction (on SQLite, up to
// busy_timeout). ctx bounds Begin's statements, not the transaction. Each marker
// needs a handler and owner token of 1 to 64 bytes, a fingerprint of at most 32,
// a positive retention and a (handler, digest) of its own. On an error no
// transaction is left open.
func (t *Transactor) Begin(ctx context.Context, markers []dedup.Marker) (*sql.Tx, []dedup.MarkerState, error) {
	order, err := markersql.CheckMarkers(markers)
	if err != nil {
		return nil, nil, fmt.Errorf("sqltx: begin: %w", err)
	}
	conn, err := t.db.Conn(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("sqltx: begin: %w", err)
	}
	tx, err := conn.BeginTx(context.WithoutCancel(ctx), t.txOpts)
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("sqltx: begin: %w", err)
	}
	found, err := t.table.WriteMarkers(ctx, queryIn(tx), markers, order)
	if err != nil {
		// A statement cancelled by ctx may have broken the connection: the
		// rollback then fails, and the server ends the transaction with it.
		_ = tx.Rollback()
		conn.Close()
		return nil, nil, fmt.Errorf("sqltx: begin: %w", err)
	}
	t.conns.Store(tx, conn)
	return tx, found, nil
}

func queryIn(tx *sql.Tx) markersql.QueryFunc {
	return func(ctx context.Context, query string, args []any, row func(scan func(...any) error) error) error {
		rows, err := tx.QueryContext(ctx, query, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := row(rows.Scan); err != nil {
				return err
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		return rows.Close()
	}
}

// Savepoint sets the savepoint the next RollbackTo returns to (SAVEPOINT
// dedup_item). Each call sets a new one; PostgreSQL and SQLite stack savepoints of
// one name, MySQL replaces it.
func (t *Transactor) Savepoint(ctx context.Context, tx *sql.Tx) error {
	if _, err := tx.ExecContext(ctx, "SAVEPOINT "+savepoint); err != nil {
		return fmt.Errorf("sqltx: savepoint: %w", err)
	}
	return nil
}

// RollbackTo undoes tx's work since the last Savepoint, recovering a transaction
// a failed statement aborted, and deletes m's marker if this run wrote it, so
// that tx, committed, leaves m's message unprocessed.
func (t *Transactor) RollbackTo(ctx context.Context, tx *sql.Tx, m dedup.Marker) error {
	if _, err := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+savepoint); err != nil {
		return fmt.Errorf("sqltx: rollback to savepoint: %w", err)
	}
	if _, err := tx.ExecContext(ctx, t.table.DeleteMarker(), m.Handler, m.Digest[:], m.Owner); err != nil {
		return fmt.Errorf("sqltx: delete marker: %w", err)
	}
	return nil
}

// Commit commits tx; a ctx already ended rolls it back instead (database/sql's
// Commit takes no context). The error wraps dedup.ErrCommitUnknown when the
// COMMIT may have reached the server; any other error means tx was rolled back.
func (t *Transactor) Commit(ctx context.Context, tx *sql.Tx) error {
	conn := t.release(tx)
	if conn != nil {
		defer conn.Close()
	}
	if err := ctx.Err(); err != nil {
		// No COMMIT was sent: rolled back, whether this rollback reaches the
		// server or the server ends the transaction with a broken connection.
		return fmt.Errorf("sqltx: commit not attempted: %w", errors.Join(err, tx.Rollback()))
	}
	closed := closedBefore(conn)
	if err := tx.Commit(); err != nil {
		return t.commitError(ctx, conn, err, closed)
	}
	return nil
}

// Rollback rolls tx back. A tx already ended (committed, rolled back) is not an
// error, so that a Rollback after a failed Commit is harmless.
func (t *Transactor) Rollback(ctx context.Context, tx *sql.Tx) error {
	if conn := t.release(tx); conn != nil {
		defer conn.Close()
	}
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("sqltx: rollback: %w", err)
	}
	return nil
}

// release forgets tx's connection and returns it (nil for a tx Begin did not open
// or already released); the caller closes it once tx has ended.
func (t *Transactor) release(tx *sql.Tx) *sql.Conn {
	c, ok := t.conns.LoadAndDelete(tx)
	if !ok {
		return nil
	}
	return c.(*sql.Conn)
}
