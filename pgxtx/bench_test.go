package pgxtx_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/internal/markersql"
	"github.com/dedupkit/dedupkit/internal/testenv"
	"github.com/dedupkit/dedupkit/pgxtx"
)

// benchGoroutines is the concurrency of BenchmarkTx: exactly this many goroutines
// (b.RunParallel runs a multiple of GOMAXPROCS).
const benchGoroutines = 8

// runConc runs op b.N times over benchGoroutines goroutines; i counts from 0.
func runConc(b *testing.B, op func(ctx context.Context, i int64) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	for range benchGoroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				if err := op(ctx, i); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// BenchmarkTx measures a transactional run's cost against a plain transaction of
// the same effect, on the PostgreSQL at DEDUP_POSTGRES_URL, directly (rtt:0) and
// through a proxy adding 500 µs to every round trip (rtt:500us), as a network
// between client and server would:
//
//   - kind:plain: BEGIN; INSERT one effect row; COMMIT (3 round trips).
//   - kind:marker: pgxtx's Begin (BEGIN and the marker INSERT … RETURNING in one
//     round trip), the same effect row, Commit (3 round trips).
//   - kind:marker-begin-apart: the same statements with BEGIN on its own, as
//     pool.BeginTx then tx.Query would send them (4 round trips): what the one
//     round trip saves.
//
// Each run writes a new key, so every marker is inserted (the hot path), into
// tables of the sub-benchmark's own, made before its clock starts.
//
//	DEDUP_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test?sslmode=disable \
//	  go test ./pgxtx -run '^$' -bench Tx -benchtime 10000x -count 10
func BenchmarkTx(b *testing.B) {
	url := testenv.PostgresURL(b)
	ctx := context.Background()
	proxy, err := testenv.NewSQLProxy(testenv.PostgresWire, testenv.PostgresHost(b, url))
	if err != nil {
		b.Fatal(err)
	}
	defer proxy.Close()
	proxy.SetLatency(500 * time.Microsecond)
	for _, rtt := range []struct {
		name string
		url  string
	}{{"rtt:0", url}, {"rtt:500us", testenv.WithPostgresHost(url, proxy.Addr())}} {
		cfg, err := pgxpool.ParseConfig(rtt.url)
		if err != nil {
			b.Fatal(err)
		}
		cfg.MaxConns = benchGoroutines // a connection each: none waits for the pool
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		if err := pool.Ping(ctx); err != nil {
			pool.Close()
			testenv.SkipNoServer(b, "PostgreSQL at DEDUP_POSTGRES_URL: %v", err)
		}
		b.Run(rtt.name, func(b *testing.B) { benchKinds(b, pool) })
		pool.Close()
	}
}

func benchKinds(b *testing.B, pool *pgxpool.Pool) {
	ctx := context.Background()
	// Each sub-benchmark writes into tables of its own, made before its clock
	// starts: none pays for the growth of another's indexes.
	type tables struct {
		tr           *pgxtx.Transactor
		insertEffect string
		insertMarker string
		table        markersql.Table
	}
	setup := func(b *testing.B) tables {
		markers := testenv.TableName()
		effects := markers + "_effects"
		tr, err := pgxtx.New(pool, pgxtx.WithTable(markers))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			tr.Close()
			pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+markers+", "+effects)
		})
		if err := tr.Migrate(ctx); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "CREATE TABLE "+effects+" (id BIGINT PRIMARY KEY, v TEXT NOT NULL)"); err != nil {
			b.Fatal(err)
		}
		table, _ := markersql.NewTable(markersql.Postgres, markers)
		return tables{tr: tr, insertEffect: "INSERT INTO " + effects + " (id, v) VALUES ($1, 'effect')",
			insertMarker: table.Insert(1), table: table}
	}
	marker := func(i int64) dedup.Marker {
		return dedup.Marker{Handler: "bench", Digest: dedup.RecordDigest(fmt.Sprint("dedup:bench:", i)),
			Owner: fmt.Sprint("owner-", i), Retention: time.Hour}
	}

	b.Run("kind:plain", func(b *testing.B) {
		tb := setup(b)
		runConc(b, func(ctx context.Context, i int64) error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, tb.insertEffect, i); err != nil {
				tx.Rollback(ctx)
				return err
			}
			return tx.Commit(ctx)
		})
	})
	b.Run("kind:marker", func(b *testing.B) {
		tb := setup(b)
		runConc(b, func(ctx context.Context, i int64) error {
			tx, found, err := tb.tr.Begin(ctx, []dedup.Marker{marker(i)})
			if err != nil {
				return err
			}
			if found[0].Found {
				tb.tr.Rollback(ctx, tx)
				return fmt.Errorf("new key found")
			}
			if _, err := tx.Exec(ctx, tb.insertEffect, i); err != nil {
				tb.tr.Rollback(ctx, tx)
				return err
			}
			return tb.tr.Commit(ctx, tx)
		})
	})
	b.Run("kind:marker-begin-apart", func(b *testing.B) {
		tb := setup(b)
		runConc(b, func(ctx context.Context, i int64) error {
			m := marker(i)
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx)
			rows, err := tx.Query(ctx, tb.insertMarker, m.Handler, m.Digest[:], m.Fingerprint, m.Owner, tb.table.Retention(m.Retention))
			if err != nil {
				return err
			}
			n := 0
			for rows.Next() {
				n++
			}
			rows.Close()
			if err := rows.Err(); err != nil || n != 1 {
				return fmt.Errorf("marker not written: %v", err)
			}
			if _, err := tx.Exec(ctx, tb.insertEffect, i); err != nil {
				return err
			}
			return tx.Commit(ctx)
		})
	})
}
