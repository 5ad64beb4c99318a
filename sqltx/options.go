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

// WithTable sets the marker table (default [DefaultTable]): an identifier of at
// most 48 bytes (an ASCII letter or '_', then letters, digits or '_'), optionally
// "schema.table", case-sensitive on PostgreSQL. Any other name is refused with an
// error wrapping dedup.ErrInvalidOption, as it is spliced into the SQL.
func WithTable(name string) Option {
	return func(c *config) error {
		if err := markersql.ValidateTable(name); err != nil {
			return fmt.Errorf("%w: %w", dedup.ErrInvalidOption, err)
		}
		c.table = name
		return nil
	}
}

// WithTxOptions sets the options of every transaction Begin opens (default: the
// database's). Any isolation level works; a stricter one can make Begin fail with
// a serialization error. ReadOnly is refused (dedup.ErrInvalidOption).
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

// WithSweep makes New start a goroutine that runs Sweep with batch at intervals
// of every, until Close (default: none). every must be positive and batch 1 to
// 100000, else the error wraps dedup.ErrInvalidOption.
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
