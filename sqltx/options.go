package sqltx

import (
	"database/sql"
	"fmt"
	"log/slog"
	"time"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/internal/markersql"
)

// DefaultTable is the marker table's name unless WithTable says otherwise.
const DefaultTable = "dedup_markers"

// Option configures a Transactor (New).
type Option func(*config) error

type config struct {
	table      string
	txOpts     *sql.TxOptions
	sweepEvery time.Duration
	sweepBatch int
	logger     *slog.Logger
}

func defaults() config {
	return config{table: DefaultTable, logger: slog.Default()}
}

// WithTable sets the marker table (default DefaultTable, "dedup_markers"). The name
// is an identifier (an ASCII letter or '_', then letters, digits or '_', at most 48
// bytes), optionally qualified by a schema as "schema.table" (on MySQL the schema is
// a database; on SQLite an attached database such as "main"). It is quoted in the
// statements, so it may be a reserved word, and on PostgreSQL it is case-sensitive.
// Anything else, such as quotes, spaces or ';', is refused with an error wrapping
// dedup.ErrInvalidOption: the name is spliced into the SQL text.
func WithTable(name string) Option {
	return func(c *config) error {
		if err := markersql.ValidateTable(name); err != nil {
			return fmt.Errorf("%w: %w", dedup.ErrInvalidOption, err)
		}
		c.table = name
		return nil
	}
}

// WithTxOptions sets the options of every transaction Begin opens (default nil: the
// driver's and server's defaults). The isolation level is the caller's choice: the
// marker works under each, and a stricter level makes Begin fail with the
// database's serialization error where a concurrent run committed the marker since
// the transaction's snapshot. ReadOnly is refused with an error wrapping
// dedup.ErrInvalidOption: Begin writes.
func WithTxOptions(opts *sql.TxOptions) Option {
	return func(c *config) error {
		if opts != nil && opts.ReadOnly {
			return fmt.Errorf("%w: transaction options: read-only, but Begin writes the markers", dedup.ErrInvalidOption)
		}
		if opts != nil {
			cp := *opts
			opts = &cp
		}
		c.txOpts = opts
		return nil
	}
}

// WithSweep starts, at New, one goroutine that deletes expired markers every period
// (Sweep with batch rows per statement) until Close. Without it (the default) no
// goroutine runs, and expired markers stay until the caller sweeps: they cost space,
// not correctness, as a Begin takes an expired marker's place. every must be
// positive and batch between 1 and 100000, else the error wraps
// dedup.ErrInvalidOption.
func WithSweep(every time.Duration, batch int) Option {
	return func(c *config) error {
		if err := markersql.CheckSweep(every, batch); err != nil {
			return fmt.Errorf("%w: %w", dedup.ErrInvalidOption, err)
		}
		c.sweepEvery, c.sweepBatch = every, batch
		return nil
	}
}

// WithLogger sets the logger the sweeper reports failed sweeps to (default
// slog.Default()). Nil is refused with an error wrapping dedup.ErrInvalidOption.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return fmt.Errorf("%w: logger is nil", dedup.ErrInvalidOption)
		}
		c.logger = l
		return nil
	}
}
