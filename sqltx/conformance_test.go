package sqltx_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/dedupkit/dedupkit/dedup/txtest"
	"github.com/dedupkit/dedupkit/internal/testenv"
	"github.com/dedupkit/dedupkit/sqltx"
)

func TestSQLitePassesTheConformanceSuite(t *testing.T)   { txtest.Run(t, harness(txtest.SQLite)) }
func TestPostgresPassesTheConformanceSuite(t *testing.T) { txtest.Run(t, harness(txtest.Postgres)) }
func TestMySQLPassesTheConformanceSuite(t *testing.T)    { txtest.Run(t, harness(txtest.MySQL)) }

var dialects = map[txtest.Dialect]sqltx.Dialect{
	txtest.SQLite: sqltx.SQLite, txtest.Postgres: sqltx.PostgreSQL, txtest.MySQL: sqltx.MySQL,
}

// sqliteDSN is a database file of the test's own. WAL and a busy timeout let a
// second connection's Begin wait for the first's transaction, as the suite expects
// of every dialect; foreign_keys lets a deferred reference refuse a COMMIT.
func sqliteDSN(t *testing.T) string {
	return "file:" + filepath.Join(t.TempDir(), "markers.db") +
		"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)"
}

// open opens the dialect's database, through a SQLProxy when proxied.
func open(t *testing.T, d txtest.Dialect, proxied bool) (*sql.DB, *testenv.SQLProxy) {
	t.Helper()
	var proxy *testenv.SQLProxy
	via := func(wire testenv.Wire, upstream string) string {
		p, err := testenv.NewSQLProxy(wire, upstream)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		proxy = p
		return p.Addr()
	}
	switch d {
	case txtest.Postgres:
		u := testenv.PostgresURL(t)
		if proxied {
			u = testenv.WithPostgresHost(u, via(testenv.PostgresWire, testenv.PostgresHost(t, u)))
		}
		return testenv.OpenSQL(t, "pgx", u), proxy
	case txtest.MySQL:
		dsn := testenv.MySQLDSN(t)
		if proxied {
			dsn = testenv.WithMySQLHost(dsn, via(testenv.MySQLWire, testenv.MySQLHost(t, dsn)))
		}
		return testenv.OpenSQL(t, "mysql", dsn), proxy
	}
	return testenv.OpenSQL(t, "sqlite", sqliteDSN(t)), nil
}

func harness(d txtest.Dialect) txtest.Harness[*sql.Tx] {
	h := txtest.Harness[*sql.Tx]{Dialect: d, Schema: "main"}
	switch d {
	case txtest.Postgres:
		h.Schema = "public"
	case txtest.MySQL:
		h.Schema = "test"
		if dsn := testenvMySQLDatabase(); dsn != "" {
			h.Schema = dsn
		}
	}
	h.New = func(t *testing.T, o txtest.Opts) *txtest.Env[*sql.Tx] { return newEnv(t, d, o) }
	h.NewWithTable = func(t *testing.T, name string) error {
		var db *sql.DB // New checks options before it uses db
		db, _ = sql.Open("sqlite", ":memory:")
		defer db.Close()
		tr, err := sqltx.New(db, dialects[d], sqltx.WithTable(name))
		if err == nil {
			tr.Close()
		}
		return err
	}
	return h
}

// testenvMySQLDatabase is the database named by DEDUP_MYSQL_DSN ("" if none).
func testenvMySQLDatabase() string {
	dsn := strings.TrimSpace(getenv("DEDUP_MYSQL_DSN"))
	_, rest, ok := strings.Cut(dsn, ")/")
	if !ok {
		return ""
	}
	db, _, _ := strings.Cut(rest, "?")
	return db
}

func newEnv(t *testing.T, d txtest.Dialect, o txtest.Opts) *txtest.Env[*sql.Tx] {
	t.Helper()
	db, proxy := open(t, d, o.Proxied)
	if o.OneConn {
		db.SetMaxOpenConns(1)
	}
	table := o.Table
	if table == "" {
		table = testenv.TableName()
	}
	opts := []sqltx.Option{sqltx.WithTable(table)}
	if o.SweepEvery > 0 {
		opts = append(opts, sqltx.WithSweep(o.SweepEvery, o.SweepBatch))
	}
	tr, err := sqltx.New(db, dialects[d], opts...)
	if err != nil {
		t.Fatal(err)
	}
	e := &txtest.Env[*sql.Tx]{
		Dialect: d, Table: table, Tr: tr, Proxy: proxy,
		Exec: func(ctx context.Context, tx *sql.Tx, q string, args ...any) error {
			_, err := tx.ExecContext(ctx, txtest.Rebind(d, q), args...)
			return err
		},
		DBExec: func(ctx context.Context, q string, args ...any) error {
			_, err := db.ExecContext(ctx, txtest.Rebind(d, q), args...)
			return err
		},
		Count: func(ctx context.Context, q string, args ...any) (int64, error) {
			var n int64
			err := db.QueryRowContext(ctx, txtest.Rebind(d, q), args...).Scan(&n)
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
		InUse:     func() int { return db.Stats().InUse },
	}
	txtest.DropTable(t, e, table)
	if !o.NoMigrate {
		if err := tr.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

var getenv = os.Getenv
