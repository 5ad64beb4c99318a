package sqltx

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/internal/markersql"
)

// Sweep deletes expired markers, by the database's clock, batch (1 to 100000)
// rows per statement, until a statement deletes fewer or ctx ends, and returns
// how many it deleted. It never deletes a marker taken over meanwhile. On
// PostgreSQL it skips markers a running Begin holds; on MySQL it runs under READ
// COMMITTED, so that it locks no gaps a Begin needs.
func (t *Transactor) Sweep(ctx context.Context, batch int) (deleted int, err error) {
	n, err := markersql.Sweep(ctx, batch, t.sweepBatch)
	if err != nil {
		return n, fmt.Errorf("sqltx: sweep: %w", err)
	}
	return n, nil
}

// sweepBatch runs one sweep statement.
func (t *Transactor) sweepBatch(ctx context.Context, batch int) (int, error) {
	var res sql.Result
	var err error
	if t.dialect == MySQL {
		res, err = t.inReadCommitted(ctx, t.table.SweepBatch(), batch)
	} else {
		res, err = t.db.ExecContext(ctx, t.table.SweepBatch(), batch)
	}
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}

func (t *Transactor) inReadCommitted(ctx context.Context, query string, args ...any) (sql.Result, error) {
	tx, err := t.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, err
	}
	res, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return nil, errors.Join(err, tx.Rollback())
	}
	return res, tx.Commit()
}

// MarkerInfo is what Lookup reads of a marker.
type MarkerInfo struct {
	Owner       string        // the token of the run that wrote it
	Fingerprint string        // its payload fingerprint; "" for none
	ExpiresIn   time.Duration // until it expires, by the database's clock; ≤ 0 once expired
}

// Forget deletes the marker of h's message key, waiting for a transaction that
// holds it, and reports whether there was one. It is the database's half of
// h.Forget: call it first, so that a redelivery in between finds neither. A nil
// h or ctx is an error wrapping dedup.ErrInvalidOption.
func (t *Transactor) Forget(ctx context.Context, h *dedup.Handler, key string) (bool, error) {
	if h == nil || ctx == nil {
		return false, fmt.Errorf("sqltx: forget: %w: nil handler or context", dedup.ErrInvalidOption)
	}
	digest := dedup.RecordDigest(h.RecordKey(key))
	res, err := t.db.ExecContext(ctx, t.table.Forget(), h.Name(), digest[:])
	if err != nil {
		return false, fmt.Errorf("sqltx: forget: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("sqltx: forget: %w", err)
	}
	return n > 0, nil
}

// Lookup reads the committed marker of handler and digest (dedup.RecordDigest of
// the record key); found is false when there is none. An expired marker not yet
// swept is found, with ExpiresIn ≤ 0.
func (t *Transactor) Lookup(ctx context.Context, handler string, digest [32]byte) (MarkerInfo, bool, error) {
	var info MarkerInfo
	var us int64
	err := t.db.QueryRowContext(ctx, t.table.Lookup(), handler, digest[:]).Scan(&info.Owner, &info.Fingerprint, &us)
	if errors.Is(err, sql.ErrNoRows) {
		return MarkerInfo{}, false, nil
	}
	if err != nil {
		return MarkerInfo{}, false, fmt.Errorf("sqltx: lookup: %w", err)
	}
	info.ExpiresIn = time.Duration(us) * time.Microsecond
	return info, true, nil
}
