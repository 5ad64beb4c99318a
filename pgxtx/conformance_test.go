package pgxtx_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/txtest"
	"github.com/dedupkit/dedupkit/internal/testenv"
	"github.com/dedupkit/dedupkit/pgxtx"
)

func TestPgxPassesTheConformanceSuite(t *testing.T) {
	txtest.Run(t, txtest.Harness[pgx.Tx]{
		Dialect: txtest.Postgres,
		Schema:  "public",
		New:     newEnv,
		NewWithTable: func(t *testing.T, name string) error {
			// New checks its options before it uses the pool, which never dials.
			pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/none")
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			tr, err := pgxtx.New(pool, pgxtx.WithTable(name))
			if err == nil {
				tr.Close()
			}
			return err
		},
	})
}

// openPool opens a pool on DEDUP_POSTGRES_URL (through a proxy when proxied), or
// skips. Cleanup closes it.
func openPool(t *testing.T, proxied, oneConn bool) (*pgxpool.Pool, *testenv.SQLProxy) {
	t.Helper()
	u := testenv.PostgresURL(t)
	var proxy *testenv.SQLProxy
	if proxied {
		p, err := testenv.NewSQLProxy(testenv.PostgresWire, testenv.PostgresHost(t, u))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		proxy = p
		u = testenv.WithPostgresHost(u, p.Addr())
	}
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	if oneConn {
		cfg.MaxConns = 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		testenv.SkipNoServer(t, "PostgreSQL at DEDUP_POSTGRES_URL does not answer: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool, proxy
}

func newEnv(t *testing.T, o txtest.Opts) *txtest.Env[pgx.Tx] {
	t.Helper()
	pool, proxy := openPool(t, o.Proxied, o.OneConn)
	table := o.Table
	if table == "" {
		table = testenv.TableName()
	}
	opts := []pgxtx.Option{pgxtx.WithTable(table)}
	if o.SweepEvery > 0 {
		opts = append(opts, pgxtx.WithSweep(o.SweepEvery, o.SweepBatch))
	}
	tr, err := pgxtx.New(pool, opts...)
	if err != nil {
		t.Fatal(err)
	}
	d := txtest.Postgres
	e := &txtest.Env[pgx.Tx]{
		Dialect: d, Table: table, Tr: tr, Proxy: proxy,
		Exec: func(ctx context.Context, tx pgx.Tx, q string, args ...any) error {
			_, err := tx.Exec(ctx, txtest.Rebind(d, q), args...)
			return err
		},
		DBExec: func(ctx context.Context, q string, args ...any) error {
			_, err := pool.Exec(ctx, txtest.Rebind(d, q), args...)
			return err
		},
		Count: func(ctx context.Context, q string, args ...any) (int64, error) {
			var n int64
			err := pool.QueryRow(ctx, txtest.Rebind(d, q), args...).Scan(&n)
			return n, err
		},
		Lookup: func(ctx context.Context, handler string, digest [32]byte) (txtest.Info, bool, error) {
			info, ok, err := tr.Lookup(ctx, handler, digest)
			return txtest.Info{Owner: info.Owner, Fingerprint: info.Fingerprint, ExpiresIn: info.ExpiresIn}, ok, err
		},
		Sweep:     tr.Sweep,
		SweepOnce: tr.SweepOnce,
		Migrate:   tr.Migrate,
		Schema:    tr.Schema,
		Close:     tr.Close,
		InUse:     func() int { return int(pool.Stat().AcquiredConns()) },
	}
	txtest.DropTable(t, e, table)
	if !o.NoMigrate {
		if err := tr.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

func TestNewRefusesInvalidOptions(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for name, opt := range map[string]pgxtx.Option{
		"read-only":        pgxtx.WithTxOptions(pgx.TxOptions{AccessMode: pgx.ReadOnly}),
		"isolation":        pgxtx.WithTxOptions(pgx.TxOptions{IsoLevel: "serializable; DROP TABLE x"}),
		"deferrable":       pgxtx.WithTxOptions(pgx.TxOptions{DeferrableMode: "x"}),
		"sweep period":     pgxtx.WithSweep(0, 10),
		"sweep batch":      pgxtx.WithSweep(time.Second, 0),
		"sweep batch high": pgxtx.WithSweep(time.Second, 100_001),
		"logger":           pgxtx.WithLogger(nil),
	} {
		if _, err := pgxtx.New(pool, opt); !errors.Is(err, dedup.ErrInvalidOption) {
			t.Errorf("%s: %v, want an error wrapping ErrInvalidOption", name, err)
		}
	}
	if _, err := pgxtx.New(nil); !errors.Is(err, dedup.ErrInvalidOption) {
		t.Errorf("nil pool: %v", err)
	}
	tr, err := pgxtx.New(pool, pgxtx.WithTxOptions(pgx.TxOptions{IsoLevel: pgx.Serializable}))
	if err != nil {
		t.Fatal(err)
	}
	tr.Close()
}
