package sqltx

import (
	"context"
	"database/sql"
	"fmt"
	"sync"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/internal/markersql"
)

// Dialect is the SQL dialect of the database behind a *sql.DB.
type Dialect uint8

const (
	// PostgreSQL, through pgx's database/sql driver ("pgx", github.com/jackc/pgx/v5/stdlib)
	// or another that reports server errors with a SQLState() string method.
	PostgreSQL Dialect = iota + 1
	// MySQL 8 and MariaDB 10.5+, through github.com/go-sql-driver/mysql.
	MySQL
	// SQLite 3.42+, through modernc.org/sqlite (driver "sqlite", pure Go).
	SQLite
)

// String returns the dialect's name.
func (d Dialect) String() string {
	switch d {
	case PostgreSQL:
		return "PostgreSQL"
	case MySQL:
		return "MySQL"
	case SQLite:
		return "SQLite"
	}
	return fmt.Sprintf("Dialect(%d)", uint8(d))
}

func (d Dialect) internal() markersql.Dialect {
	switch d {
	case PostgreSQL:
		return markersql.Postgres
	case MySQL:
		return markersql.MySQL
	}
	return markersql.SQLite
}

// Transactor runs transactional handlers' transactions on a *sql.DB, with their
// runs' markers in a table of that database. It implements dedup.Transactor for
// *sql.Tx. Safe for concurrent use; Close stops its sweeper.
type Transactor struct {
	db      *sql.DB
	dialect Dialect
	table   markersql.Table
	txOpts  *sql.TxOptions
	sweeper *markersql.Sweeper // nil without WithSweep

	// conns maps each open *sql.Tx from Begin to its *sql.Conn, which Commit
	// asks after an unclear COMMIT failure (commitError). Begin takes the
	// connection itself: database/sql pools a Tx's as its Commit returns.
	conns sync.Map
}

var _ dedup.Transactor[*sql.Tx] = (*Transactor)(nil)

// New returns a Transactor for db, whose database speaks dialect d. It does not
// create the table (see Schema and Migrate). A nil db, an unknown dialect or a
// bad option returns an error wrapping dedup.ErrInvalidOption.
func New(db *sql.DB, d Dialect, opts ...Option) (*Transactor, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: sqltx: db is nil", dedup.ErrInvalidOption)
	}
	if d < PostgreSQL || d > SQLite {
		return nil, fmt.Errorf("%w: sqltx: unknown dialect %v", dedup.ErrInvalidOption, d)
	}
	c := defaults()
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("sqltx: %w: nil Option", dedup.ErrInvalidOption)
		}
		if err := o(&c); err != nil {
			return nil, fmt.Errorf("sqltx: %w", err)
		}
	}
	table, err := markersql.NewTable(d.internal(), c.table)
	if err != nil { // validated by WithTable, or the default
		return nil, fmt.Errorf("%w: sqltx: %w", dedup.ErrInvalidOption, err)
	}
	t := &Transactor{db: db, dialect: d, table: table, txOpts: c.txOpts}
	if c.sweepEvery > 0 {
		t.sweeper = markersql.StartSweeper(c.sweepEvery, c.sweepBatch, t.Sweep, c.logger, "sqltx")
	}
	return t, nil
}

// Schema returns the statements, each ended by ';', that create the marker table
// (handler, key_hash, fingerprint, owner, expires_at; primary key handler and
// key_hash) and its expiry index in the Transactor's dialect.
func (t *Transactor) Schema() string { return t.table.SchemaText() }

// Migrate creates the marker table and its index unless they exist (Schema).
// Run it from one place: two Migrates racing on PostgreSQL can fail.
func (t *Transactor) Migrate(ctx context.Context) error {
	for _, s := range t.table.Schema() {
		if _, err := t.db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("sqltx: migrate: %w", err)
		}
	}
	return nil
}

// Close stops the sweeper, if any, and waits for it; a sweep in flight is
// cancelled. It does not close the *sql.DB nor end open transactions, may be
// called more than once, and returns nil.
func (t *Transactor) Close() error {
	if t.sweeper != nil {
		t.sweeper.Stop()
	}
	return nil
}
