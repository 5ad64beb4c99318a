package markersql

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dedupkit/dedupkit/dedup"
)

// Limits on a marker's columns, in bytes.
const (
	MaxHandler     = 64
	MaxFingerprint = 32
	MaxOwner       = 64
	// MaxRetention keeps every expiry inside the column types' range (DATETIME ends
	// at year 9999).
	MaxRetention = 100 * 365 * 24 * time.Hour
)

// maxChunk bounds the markers of one statement: 5 arguments each stays under
// SQLite's 32766 and MySQL's 65535 placeholders. A Begin with more markers writes
// them with one statement per chunk.
const maxChunk = 1000

// CheckMarkers validates the markers of one Begin and returns their indices in
// (handler, digest) order. Writing in one global order makes two Begins that share
// markers lock them in the same order, so that they wait for each other instead of
// deadlocking. Errors name a marker by its index, never by its digest.
func CheckMarkers(ms []dedup.Marker) ([]int, error) {
	if len(ms) == 0 {
		return nil, errors.New("no markers")
	}
	for i, m := range ms {
		if err := checkMarker(m); err != nil {
			return nil, fmt.Errorf("marker %d: %w", i, err)
		}
	}
	order := make([]int, len(ms))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		return cmp.Or(strings.Compare(ms[a].Handler, ms[b].Handler), bytes.Compare(ms[a].Digest[:], ms[b].Digest[:]))
	})
	for i := 1; i < len(order); i++ {
		a, b := ms[order[i-1]], ms[order[i]]
		if a.Handler == b.Handler && a.Digest == b.Digest {
			// One statement cannot write one row twice (PostgreSQL refuses, the
			// others would report both as written), and one transaction's two runs
			// of one record would be one run.
			return nil, fmt.Errorf("markers %d and %d are for the same handler and record", min(order[i-1], order[i]), max(order[i-1], order[i]))
		}
	}
	return order, nil
}

func checkMarker(m dedup.Marker) error {
	if err := checkText("handler", m.Handler, 1, MaxHandler); err != nil {
		return err
	}
	if err := checkText("fingerprint", m.Fingerprint, 0, MaxFingerprint); err != nil {
		return err
	}
	// RollbackTo deletes by owner, and MySQL tells its own rows by owner: a run
	// without a token of its own could take another's row for its own.
	if err := checkText("owner", m.Owner, 1, MaxOwner); err != nil {
		return err
	}
	if m.Retention <= 0 || m.Retention > MaxRetention {
		return fmt.Errorf("retention %v: want more than 0 and at most %v", m.Retention, MaxRetention)
	}
	return nil
}

func checkText(what, s string, minLen, maxLen int) error {
	switch {
	case len(s) < minLen:
		return fmt.Errorf("%s is empty", what)
	case len(s) > maxLen:
		return fmt.Errorf("%s is %d bytes, more than %d", what, len(s), maxLen)
	case !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0:
		// PostgreSQL's text refuses both; checked here so every dialect agrees.
		return fmt.Errorf("%s is not UTF-8 text without NUL bytes", what)
	}
	return nil
}

// Retention returns the retention argument of a marker: r in RetentionUnit, rounded
// up, so that no marker is written already expired.
func (t Table) Retention(r time.Duration) int64 {
	u := t.RetentionUnit()
	return int64((r + u - 1) / u)
}

// QueryFunc runs a statement with args in the transaction, calling row once per
// result row with the function that scans it.
type QueryFunc func(ctx context.Context, query string, args []any, row func(scan func(dest ...any) error) error) error

// WriteMarkers writes ms (checked by CheckMarkers, order its result) in the
// transaction q runs in, and returns what it found for each, in ms's order.
//
// PostgreSQL and SQLite: the insert returns the rows it inserted or took over; the
// others are unexpired markers of earlier runs, whose fingerprints a second
// statement reads, only when there are any (the rare case: Redis answers most
// duplicates before a transaction begins). MySQL: its insert returns nothing, so one
// locking read classifies every row by owner: a row holding this marker's owner
// token was written by this statement. The owner is the run's own token, so no
// earlier run's row holds it.
func (t Table) WriteMarkers(ctx context.Context, q QueryFunc, ms []dedup.Marker, order []int) ([]dedup.MarkerState, error) {
	found := make([]dedup.MarkerState, len(ms))
	for chunk := range slices.Chunk(order, maxChunk) {
		if err := t.writeChunk(ctx, q, ms, chunk, found); err != nil {
			return nil, err
		}
	}
	return found, nil
}

func (t Table) writeChunk(ctx context.Context, q QueryFunc, ms []dedup.Marker, chunk []int, found []dedup.MarkerState) error {
	args := make([]any, 0, 5*len(chunk))
	for _, i := range chunk {
		m := &ms[i]
		args = append(args, m.Handler, m.Digest[:], m.Fingerprint, m.Owner, t.Retention(m.Retention))
	}
	byKey := make(map[string]int, len(chunk))
	for _, i := range chunk {
		byKey[rowKey(ms[i].Handler, ms[i].Digest[:])] = i
	}
	// pending: the markers whose fate the insert did not tell.
	pending := make(map[int]bool, len(chunk))
	for _, i := range chunk {
		pending[i] = true
	}
	if err := q(ctx, t.Insert(len(chunk)), args, func(scan func(...any) error) error {
		var h string
		var k []byte
		if err := scan(&h, &k); err != nil {
			return err
		}
		delete(pending, byKey[rowKey(h, k)])
		return nil
	}); err != nil {
		return fmt.Errorf("insert markers: %w", err)
	}
	if len(pending) == 0 {
		return nil
	}
	sel := make([]any, 0, 2*len(pending))
	for _, i := range chunk {
		if pending[i] {
			sel = append(sel, ms[i].Handler, ms[i].Digest[:])
		}
	}
	if err := q(ctx, t.SelectMarkers(len(pending)), sel, func(scan func(...any) error) error {
		var h, owner, fp string
		var k []byte
		if err := scan(&h, &k, &owner, &fp); err != nil {
			return err
		}
		i, ok := byKey[rowKey(h, k)]
		if !ok || !pending[i] {
			return nil
		}
		delete(pending, i)
		if owner != ms[i].Owner {
			found[i] = dedup.MarkerState{Found: true, Fingerprint: fp}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("read markers: %w", err)
	}
	if len(pending) > 0 {
		// Each was written or kept by the insert, and is locked by it: it cannot
		// have gone. A row that did is reported, not guessed at.
		return fmt.Errorf("read markers: %d marker rows missing after the insert", len(pending))
	}
	return nil
}

func rowKey(handler string, digest []byte) string {
	return handler + "\x00" + string(digest)
}
