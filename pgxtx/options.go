package pgxtx

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/internal/markersql"
)

// DefaultTable is the marker table's name unless WithTable says otherwise.
const DefaultTable = "dedup_markers"

// Option configures a Transactor (New).
type Option func(*config) error

type config struct {
	table      string
	txOpts     pgx.TxOptions
	sweepEvery time.Duration
	sweepBatch int
	logger     *slog.Logger
}

func defaults() config {
	return config{table: DefaultTable, logger: slog.Default()}
}

// WithTable sets the marker table (default [DefaultTable]): an identifier of at
// most 48 bytes (an ASCII letter or '_', then letters, digits or '_'), optionally
// "schema.table", case-sensitive. Any other name is refused with an error
// wrapping dedup.ErrInvalidOption, as it is spliced into the SQL.
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
// server's). Any isolation level works; a stricter one can make Begin fail with a
// serialization error. IsoLevel, AccessMode and DeferrableMode must be pgx's
// constants, as they are spliced into BEGIN, and pgx.ReadOnly is refused; the
// error wraps dedup.ErrInvalidOption. BeginQuery and CommitQuery are used as given.
func WithTxOptions(opts pgx.TxOptions) Option {
	return func(c *config) error {
		switch opts.IsoLevel {
		case "", pgx.Serializable, pgx.RepeatableRead, pgx.ReadCommitted, pgx.ReadUncommitted:
		default:
			return fmt.Errorf("%w: transaction options: isolation level %q is not one of pgx's", dedup.ErrInvalidOption, opts.IsoLevel)
		}
		switch opts.DeferrableMode {
		case "", pgx.Deferrable, pgx.NotDeferrable:
		default:
			return fmt.Errorf("%w: transaction options: deferrable mode %q is not one of pgx's", dedup.ErrInvalidOption, opts.DeferrableMode)
		}
		switch opts.AccessMode {
		case "", pgx.ReadWrite:
		case pgx.ReadOnly:
			return fmt.Errorf("%w: transaction options: read-only, but Begin writes the markers", dedup.ErrInvalidOption)
		default:
			return fmt.Errorf("%w: transaction options: access mode %q is not one of pgx's", dedup.ErrInvalidOption, opts.AccessMode)
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
