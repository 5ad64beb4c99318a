// Package txtest is the conformance suite of dedup.Transactor implementations (sqltx,
// pgxtx): one body of tests, run on every dialect through a Harness.
package txtest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// Dialect names the database under test.
type Dialect string

// The dialects.
const (
	Postgres Dialect = "postgres"
	MySQL    Dialect = "mysql"
	SQLite   Dialect = "sqlite"
)

// Info is what a Lookup reads of a marker.
type Info struct {
	Owner, Fingerprint string
	ExpiresIn          time.Duration
}

// Env is one Transactor on a marker table of its own, with what the suite needs around
// it. Statements take '?' placeholders (Rebind numbers them for PostgreSQL).
type Env[T any] struct {
	Dialect Dialect
	Table   string // as passed to WithTable
	Tr      dedup.Transactor[T]
	// Exec runs a statement in tx (a handler's writes).
	Exec func(ctx context.Context, tx T, query string, args ...any) error
	// DBExec runs a statement outside any transaction.
	DBExec func(ctx context.Context, query string, args ...any) error
	// Count runs a query returning one integer.
	Count     func(ctx context.Context, query string, args ...any) (int64, error)
	Lookup    func(ctx context.Context, handler string, digest [32]byte) (Info, bool, error)
	Sweep     func(ctx context.Context, batch int) (int, error)
	SweepOnce func(ctx context.Context, batch int) (int, error) // one statement
	Migrate   func(ctx context.Context) error
	Schema    func() string
	Close     func() error
	// InUse returns how many connections are out of the pool (in transactions).
	InUse func() int
	// Proxy carries the Transactor's connections (Opts.Proxied); nil for SQLite.
	Proxy *testenv.SQLProxy
}

// Opts says how to build an Env.
type Opts struct {
	Table      string // "" for a new testenv.TableName(); the harness drops it at cleanup
	Proxied    bool   // connections through a SQLProxy (not SQLite)
	OneConn    bool   // a pool of one connection, so that the next transaction reuses it
	NoMigrate  bool   // leave the table uncreated
	SweepEvery time.Duration
	SweepBatch int
}

// Harness builds Envs of one dialect for one package.
type Harness[T any] struct {
	Dialect Dialect
	// Schema qualifies a table name: public, the DSN's database, or main.
	Schema string
	// New builds an Env, skipping the test when the server is missing.
	New func(t *testing.T, o Opts) *Env[T]
	// NewWithTable returns New's error for a WithTable(name) option.
	NewWithTable func(t *testing.T, name string) error
}

// Rebind turns '?' placeholders into PostgreSQL's $1, $2, … for Postgres.
func Rebind(d Dialect, query string) string {
	if d != Postgres {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// DropTable drops a table the test created, at cleanup.
func DropTable[T any](t *testing.T, e *Env[T], name string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.DBExec(ctx, "DROP TABLE IF EXISTS "+name); err != nil {
			t.Logf("drop %s: %v", name, err)
		}
	})
}
