package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedupkit/pgxtx"
)

// The transactional variant of the soak (-tx): each consumer's handler runs through
// dnats.TxHandler on pgxtx, and its side effect is a row of a PostgreSQL table
// (soakfx_<run>: message, claim token, pid) inserted in the transaction that writes
// the run's marker (soakmk_<run>). A failing run (the injected Naks) inserts its row
// and then fails: its transaction rolls back, row and marker with it. The dedup Redis
// keeps nothing on disk, so its restart loses every record; the markers answer for
// them. The verdict reads the table: every message must have exactly one row (lost
// counts those with none, effects_repeated the rows beyond one), whatever the kills
// and the restart did.

// setUpTx creates the variant's two tables (dropped at the end).
func (s *soakRun) setUpTx(ctx context.Context, id string) error {
	pool, err := pgxpool.New(ctx, s.cfg.postgres)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	s.closers = append(s.closers, pool.Close)
	s.pg = pool
	s.txMarkers, s.txEffects = "soakmk_"+id, "soakfx_"+id
	tr, err := pgxtx.New(pool, pgxtx.WithTable(s.txMarkers))
	if err != nil {
		return err
	}
	defer tr.Close()
	s.closers = append(s.closers, func() { s.dropTx() })
	if err := tr.Migrate(ctx); err != nil {
		return fmt.Errorf("postgres: create the marker table: %w", err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+s.txEffects+" (msg INTEGER NOT NULL, token TEXT NOT NULL, pid INTEGER NOT NULL)"); err != nil {
		return fmt.Errorf("postgres: create the effects table: %w", err)
	}
	return nil
}

// dropTx drops the variant's tables.
func (s *soakRun) dropTx() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, t := range []string{s.txEffects, s.txMarkers} {
		if _, err := s.pg.Exec(ctx, "DROP TABLE IF EXISTS "+t); err != nil {
			fmt.Fprintln(s.stderr, "soak: drop", t+":", err)
		}
	}
}

// countTx reads the effects table: lost (messages without a row) and effects_repeated
// (rows beyond one per message).
func (s *soakRun) countTx(ctx context.Context) error {
	rows, err := s.pg.Query(ctx, "SELECT msg, COUNT(*) FROM "+s.txEffects+" GROUP BY msg")
	if err != nil {
		return fmt.Errorf("postgres: read the effects: %w", err)
	}
	perMsg := make([]int, s.cfg.messages)
	var msg, n int
	if _, err := pgx.ForEachRow(rows, []any{&msg, &n}, func() error {
		if msg < 0 || msg >= len(perMsg) {
			return fmt.Errorf("postgres: an effect of message %d, not one of the soak's", msg)
		}
		perMsg[msg] = n
		return nil
	}); err != nil {
		return err
	}
	lost, repeated := 0, 0
	for _, n := range perMsg {
		if n == 0 {
			lost++
		}
		repeated += max(n-1, 0)
	}
	s.rep.Lost, s.rep.EffectsRepeated = lost, &repeated
	return nil
}

// fmtCount renders an optional count.
func fmtCount(n *int) string {
	if n == nil {
		return "not counted"
	}
	return strconv.Itoa(*n)
}
