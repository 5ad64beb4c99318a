package pgxtx

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/internal/markersql"
)

// Sweep deletes expired markers, by the database's clock, batch (1 to 100000)
// rows per statement, until a statement deletes fewer or ctx ends, and returns
// how many it deleted. It never deletes a marker taken over meanwhile, and skips
// markers a running Begin holds.
func (t *Transactor) Sweep(ctx context.Context, batch int) (deleted int, err error) {
	n, err := markersql.Sweep(ctx, batch, t.sweepBatch)
	if err != nil {
		return n, fmt.Errorf("pgxtx: sweep: %w", err)
	}
	return n, nil
}

// sweepBatch runs one sweep statement.
func (t *Transactor) sweepBatch(ctx context.Context, batch int) (int, error) {
	tag, err := t.pool.Exec(ctx, t.table.SweepBatch(), batch)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
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
		return false, fmt.Errorf("pgxtx: forget: %w: nil handler or context", dedup.ErrInvalidOption)
	}
	digest := dedup.RecordDigest(h.RecordKey(key))
	tag, err := t.pool.Exec(ctx, t.table.Forget(), h.Name(), digest[:])
	if err != nil {
		return false, fmt.Errorf("pgxtx: forget: %w", err)
	}
	return tag.RowsAffected() > 0, nil
}

// Lookup reads the committed marker of handler and digest (dedup.RecordDigest of
// the record key); found is false when there is none. An expired marker not yet
// swept is found, with ExpiresIn ≤ 0.
func (t *Transactor) Lookup(ctx context.Context, handler string, digest [32]byte) (MarkerInfo, bool, error) {
	var info MarkerInfo
	var us int64
	err := t.pool.QueryRow(ctx, t.table.Lookup(), handler, digest[:]).Scan(&info.Owner, &info.Fingerprint, &us)
	if errors.Is(err, pgx.ErrNoRows) {
		return MarkerInfo{}, false, nil
	}
	if err != nil {
		return MarkerInfo{}, false, fmt.Errorf("pgxtx: lookup: %w", err)
	}
	info.ExpiresIn = time.Duration(us) * time.Microsecond
	return info, true, nil
}
