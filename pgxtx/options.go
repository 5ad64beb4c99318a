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

// WithTable sets the marker table (default DefaultTable, "dedup_markers"). The name
// is an identifier (an ASCII letter or '_', then letters, digits or '_', at most 48
// bytes), optionally qualified by a schema as "schema.table". It is quoted in the
// statements, so it may be a reserved word, and it is case-sensitive. Anything
// else, such as quotes, spaces or ';', is refused with an error wrapping
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

// WithTxOptions sets the options of every transaction Begin opens (default: the
// zero pgx.TxOptions, the server's defaults). The isolation level is the caller's
// choice: the marker works under each, and a stricter level makes Begin fail with a
// serialization error where a concurrent run committed the marker since the
// transaction's snapshot. pgx splices IsoLevel and DeferrableMode into its BEGIN, so
// only pgx's constants are accepted; AccessMode pgx.ReadOnly is refused, as Begin
// writes. BeginQuery and CommitQuery are used as given (a read-only BeginQuery makes
// every Begin fail). A refused option's error wraps dedup.ErrInvalidOption.
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
