package nats

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/dedupkit/dedupkit/dedup/txtest"
	"github.com/dedupkit/dedupkit/internal/embedded"
	"github.com/dedupkit/dedupkit/internal/testenv"
	"github.com/dedupkit/dedupkit/sqltx"
)

// orderDB is a database for the transactional tests: a marker table and an orders
// table (the handlers' effects: one row per run that committed), both of the test's
// own, dropped at cleanup.
type orderDB struct {
	name            string // sqlite, postgres, mysql
	db              *sql.DB
	tr              *sqltx.Transactor
	markers, orders string // table names
}

// sqliteFile is a SQLite database file of the test's own, with the busy timeout and
// WAL that let transactions wait for each other (see package sqltx).
func sqliteFile(t *testing.T) string {
	return "file:" + filepath.Join(t.TempDir(), "orders.db") + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)"
}

// orderDBs returns SQLite (always) and PostgreSQL and MariaDB when their variables
// are set (DEDUP_POSTGRES_URL, DEDUP_MYSQL_DSN); without one, the test goes on
// without that database, or fails under DEDUP_REQUIRE_SERVERS=1.
func orderDBs(t *testing.T, opts ...sqltx.Option) []*orderDB {
	t.Helper()
	out := []*orderDB{newOrderDB(t, "sqlite", opts...)}
	for name, env := range map[string]string{"postgres": "DEDUP_POSTGRES_URL", "mysql": "DEDUP_MYSQL_DSN"} {
		if os.Getenv(env) == "" {
			if testenv.Required() {
				t.Fatalf("DEDUP_REQUIRE_SERVERS=1 but %s is not set", env)
			}
			t.Logf("%s is not set: not run on %s", env, name)
			continue
		}
		out = append(out, newOrderDB(t, name, opts...))
	}
	return out
}

// newOrderDB opens one database; dsn "" for the default of its kind (the variable,
// or a new SQLite file).
func newOrderDB(t *testing.T, name string, opts ...sqltx.Option) *orderDB {
	t.Helper()
	return newOrderDBAt(t, name, "", opts...)
}

func newOrderDBAt(t *testing.T, name, dsn string, opts ...sqltx.Option) *orderDB {
	t.Helper()
	var dialect sqltx.Dialect
	var driver string
	switch name {
	case "postgres":
		driver, dialect = "pgx", sqltx.PostgreSQL
		if dsn == "" {
			dsn = testenv.PostgresURL(t)
		}
	case "mysql":
		driver, dialect = "mysql", sqltx.MySQL
		if dsn == "" {
			dsn = testenv.MySQLDSN(t) + "?interpolateParams=true"
		}
	default:
		driver, dialect = "sqlite", sqltx.SQLite
		if dsn == "" {
			dsn = sqliteFile(t)
		}
	}
	db := testenv.OpenSQL(t, driver, dsn)
	markers, orders := testenv.TableName(), testenv.TableName()
	tr, err := sqltx.New(db, dialect, append([]sqltx.Option{sqltx.WithTable(markers)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tr.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+orders+" (order_key VARCHAR(64) NOT NULL, pid INTEGER NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		tr.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, table := range []string{markers, orders} {
			if _, err := db.ExecContext(ctx, "DROP TABLE "+table); err != nil {
				t.Logf("drop %s: %v", table, err)
			}
		}
	})
	return &orderDB{name: name, db: db, tr: tr, markers: markers, orders: orders}
}

// bind numbers '?' placeholders for PostgreSQL.
func (d *orderDB) bind(q string) string { return txtest.Rebind(txtest.Dialect(d.name), q) }

// insert writes key's effect in tx: a row of the orders table.
func (d *orderDB) insert(ctx context.Context, tx *sql.Tx, key string, pid int) error {
	_, err := tx.ExecContext(ctx, d.bind("INSERT INTO "+d.orders+" (order_key, pid) VALUES (?, ?)"), key, pid)
	return err
}

// rows returns how many committed effects key has.
func (d *orderDB) rows(t *testing.T, key string) int {
	t.Helper()
	var n int
	if err := d.db.QueryRowContext(context.Background(), d.bind("SELECT COUNT(*) FROM "+d.orders+" WHERE order_key = ?"), key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// all returns every committed effect: key → rows.
func (d *orderDB) all(t *testing.T) map[string]int {
	t.Helper()
	rs, err := d.db.QueryContext(context.Background(), "SELECT order_key, COUNT(*) FROM "+d.orders+" GROUP BY order_key")
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	out := map[string]int{}
	for rs.Next() {
		var k string
		var n int
		if err := rs.Scan(&k, &n); err != nil {
			t.Fatal(err)
		}
		out[k] = n
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// sub is e for a subtest: its connection, with names of the subtest's own.
func (e *env) sub(t *testing.T) *env {
	id := suffix()
	return &env{t: t, nc: e.nc, js: e.js, id: id, subject: "dkt." + id}
}

// embeddedNATS starts an in-process NATS server for the test and returns its URL.
func embeddedNATS(t *testing.T) string {
	t.Helper()
	srv, err := embedded.StartNATS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv.URL()
}
