package main

import (
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/pgxtx"
)

// Scenario e: the transactional marker against PostgreSQL (-postgres, or
// DEDUP_POSTGRES_URL; skipped without one). -tx-concurrency goroutines (consumers)
// each commit one message per operation, a business row of a table of the run's own:
//
//   - plain-tx: BEGIN, INSERT the row, COMMIT: what a handler costs without dedup;
//   - marker-only: the same with the marker written in the transaction, and no Redis
//     (the inbox tables' way: pgxtx's Begin, which sends BEGIN and the marker's INSERT
//     in one round trip);
//   - dedup-tx: the same through dedup.DoTx (the local tier, the marker, COMMIT, and
//     the DONE record written to Redis in the background; no claim);
//   - dedup-tx-batch64: dedup.RunTx of 64 messages (one transaction, one marker
//     statement, one COMMIT, no savepoint unless an item fails); its operations are
//     messages;
//   - dup-marker-only, dup-dedup, dup-dedup-store: a message already committed, again:
//     through the marker alone (a transaction that finds it and rolls back), through
//     DoTx (answered by the local tier), and through DoTx on a handler without a local
//     tier (answered by the marker, and its DONE record written again).
//
// Before each measurement both tables are emptied (outside the timer and the CPU
// meters) and, for the dup-* variants, -tx-dup-keys messages (2000) committed through
// the variant's own path.

const (
	txPlain       = "plain-tx"
	txMarkerOnly  = "marker-only"
	txDedup       = "dedup-tx"
	txDedupBatch  = "dedup-tx-batch64"
	txDupMarker   = "dup-marker-only"
	txDupDedup    = "dup-dedup"
	txDupDedupSto = "dup-dedup-store"

	txBatch = 64 // messages per RunTx
)

var txVariants = []string{txPlain, txMarkerOnly, txDedup, txDedupBatch, txDupMarker, txDupDedup, txDupDedupSto}

// txState is what scenario e keeps across rounds.
type txState struct {
	pool             *pgxpool.Pool
	tr               *pgxtx.Transactor
	markers, effects string
	h, hStore        *dedup.Handler // hStore: no local tier
}

func (b *bench) setupTx(ctx context.Context) error {
	st := &b.tx
	pool, err := pgxpool.New(ctx, b.cfg.postgres)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	b.closers = append(b.closers, func() error { pool.Close(); return nil })
	st.pool = pool
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	st.markers, st.effects = "dkbench_mk_"+b.id, "dkbench_fx_"+b.id
	if st.tr, err = pgxtx.New(pool, pgxtx.WithTable(st.markers)); err != nil {
		return err
	}
	b.closers = append(b.closers, st.tr.Close, b.dropTxTables)
	if err := st.tr.Migrate(ctx); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+st.effects+" (msg TEXT PRIMARY KEY, amount INTEGER NOT NULL)"); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	if st.h, err = b.dd.Register("tx", dedup.WithRetention(retention)); err != nil {
		return err
	}
	if st.hStore, err = b.dd.Register("tx-store", dedup.WithRetention(retention), dedup.WithLocalCache(0, 0)); err != nil {
		return err
	}
	// Warm up: the pool's connections, the statements, the scripts.
	warm := min(b.cfg.duration/5, 200*time.Millisecond)
	for _, v := range []string{txPlain, txMarkerOnly, txDedup, txDedupBatch} {
		if _, err := load(ctx, b.cfg.txConcurrency, warm, b.txOp(v, keyMaker{head: "warm-" + v + "-"})); err != nil {
			return fmt.Errorf("warm-up %s: %w", v, err)
		}
	}
	return b.emptyTx(ctx)
}

// dropTxTables drops scenario e's tables.
func (b *bench) dropTxTables() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error
	for _, t := range []string{b.tx.effects, b.tx.markers} {
		if _, err := b.tx.pool.Exec(ctx, "DROP TABLE IF EXISTS "+t); err != nil {
			errs = append(errs, fmt.Errorf("drop %s: %w", t, err))
		}
	}
	return errors.Join(errs...)
}

// emptyTx empties both tables and forgets the run's Redis keys.
func (b *bench) emptyTx(ctx context.Context) error {
	if _, err := b.tx.pool.Exec(ctx, "TRUNCATE "+b.tx.effects+", "+b.tx.markers); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	return b.forget(ctx)
}

// insertEffect is the handlers' work: the message's business row.
func (b *bench) insertEffect(ctx context.Context, tx pgx.Tx, key string) error {
	_, err := tx.Exec(ctx, "INSERT INTO "+b.tx.effects+" (msg, amount) VALUES ($1, 1)", key)
	return err
}

// markerOf is the marker a run of a message of handler h writes; each run's owner is
// its own, as a claim's token is.
func markerOf(h *dedup.Handler, key string) dedup.Marker {
	return dedup.Marker{Handler: h.Name(), Digest: dedup.RecordDigest(h.RecordKey(key)),
		Owner: "bench-" + strconv.FormatUint(markerRuns.Add(1), 36), Retention: retention}
}

var markerRuns atomic.Uint64

// txOp returns variant's operation on the keys of km (dup-* variants: the first
// -tx-dup-keys of them, committed beforehand, over and over).
func (b *bench) txOp(variant string, km keyMaker) op {
	st := &b.tx
	dupKey := func(w, i int) string { return km.key(w%b.cfg.txConcurrency, i%(b.cfg.txDupKeys/b.cfg.txConcurrency)) }
	work := func(key string) func(context.Context, pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error { return b.insertEffect(ctx, tx, key) }
	}
	markerRun := func(ctx context.Context, key string, wantFound bool) error {
		tx, found, err := st.tr.Begin(ctx, []dedup.Marker{markerOf(st.h, key)})
		if err != nil {
			return err
		}
		if found[0].Found != wantFound {
			_ = st.tr.Rollback(ctx, tx)
			return fmt.Errorf("marker of %s found: %v", key, found[0].Found)
		}
		if wantFound {
			return st.tr.Rollback(ctx, tx)
		}
		if err := b.insertEffect(ctx, tx, key); err != nil {
			_ = st.tr.Rollback(ctx, tx)
			return err
		}
		return st.tr.Commit(ctx, tx)
	}
	doTx := func(h *dedup.Handler, want dedup.Outcome) op {
		return func(ctx context.Context, w, i int) error {
			key := km.key(w, i)
			if want == dedup.Duplicate {
				key = dupKey(w, i)
			}
			res, err := dedup.DoTx(ctx, h, key, st.tr, work(key))
			if err == nil && res.Outcome != want {
				err = fmt.Errorf("DoTx of %s answered %v, want %v", key, res.Outcome, want)
			}
			return err
		}
	}
	switch variant {
	case txPlain:
		return func(ctx context.Context, w, i int) error {
			tx, err := st.pool.Begin(ctx)
			if err != nil {
				return err
			}
			if err := b.insertEffect(ctx, tx, km.key(w, i)); err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
			return tx.Commit(ctx)
		}
	case txMarkerOnly:
		return func(ctx context.Context, w, i int) error { return markerRun(ctx, km.key(w, i), false) }
	case txDupMarker:
		return func(ctx context.Context, w, i int) error { return markerRun(ctx, dupKey(w, i), true) }
	case txDedup:
		return doTx(st.h, dedup.Processed)
	case txDupDedup:
		return doTx(st.h, dedup.Duplicate)
	case txDupDedupSto:
		return doTx(st.hStore, dedup.Duplicate)
	default: // txDedupBatch
		return func(ctx context.Context, w, i int) error {
			items := make([]dedup.Item, txBatch)
			for j := range items {
				items[j] = dedup.Item{Key: km.key(w, i*txBatch+j)}
			}
			for j, r := range dedup.RunTx(ctx, st.h, items, st.tr, func(ctx context.Context, tx pgx.Tx, j int) error {
				return b.insertEffect(ctx, tx, items[j].Key)
			}) {
				if r.Err != nil || r.Outcome != dedup.Processed {
					return fmt.Errorf("batch item %d: %v %v", j, r.Outcome, r.Err)
				}
			}
			return nil
		}
	}
}

// prepareDups commits the -tx-dup-keys messages a dup-* variant of km repeats, through
// its own path.
func (b *bench) prepareDups(ctx context.Context, variant string, km keyMaker) error {
	st := &b.tx
	c := b.cfg.txConcurrency
	per := b.cfg.txDupKeys / c
	h := st.h
	if variant == txDupDedupSto {
		h = st.hStore
	}
	for w := range c {
		for i := range per {
			key := km.key(w, i)
			var err error
			if variant == txDupMarker {
				err = b.txOp(txMarkerOnly, km)(ctx, w, i)
			} else {
				var res dedup.Result
				res, err = dedup.DoTx(ctx, h, key, st.tr, func(ctx context.Context, tx pgx.Tx) error { return b.insertEffect(ctx, tx, key) })
				if err == nil && res.Outcome != dedup.Processed {
					err = fmt.Errorf("commit of %s answered %v", key, res.Outcome)
				}
			}
			if err != nil {
				return fmt.Errorf("prepare %s: %w", variant, err)
			}
		}
	}
	return nil
}

func (b *bench) roundTx(ctx context.Context, r int) error {
	c := b.cfg.txConcurrency
	for j := range txVariants {
		v := txVariants[(j+r)%len(txVariants)] // each round starts with another variant
		km := keyMaker{head: fmt.Sprintf("r%d-%s-", r, v)}
		if err := b.emptyTx(ctx); err != nil {
			return err
		}
		switch v {
		case txDupMarker, txDupDedup, txDupDedupSto:
			if err := b.prepareDups(ctx, v, km); err != nil {
				return err
			}
		}
		meter := b.startCPU(ctx)
		var m metrics
		var err error
		pprof.Do(ctx, pprof.Labels("scenario", "tx", "variant", v, "concurrency", strconv.Itoa(c)), func(ctx context.Context) {
			m, err = load(ctx, c, b.cfg.duration, b.txOp(v, km))
		})
		if err != nil {
			return fmt.Errorf("%s: %w", v, err)
		}
		if v == txDedupBatch { // an operation is a batch: the rate is per message, the latency not shown
			m[mOps] *= txBatch
			delete(m, mP50)
			delete(m, mP99)
		}
		meter.stop(ctx).addTo(m)
		if err := b.record(ctx, "tx", v, 0, r, m); err != nil {
			return err
		}
	}
	return nil
}
