package dedup

import (
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/dedupkit/dedupkit/keys"
	"github.com/dedupkit/dedupkit/lru"
)

const (
	// DefaultPrefix is the first segment of every record key unless WithPrefix is given.
	DefaultPrefix = "dedup"

	defaultRetention    = 24 * time.Hour
	defaultLease        = 30 * time.Second
	defaultLocalSize    = 10_000
	minLease            = 30 * time.Millisecond
	maxLocalSize        = 1 << 24
	defaultReplyLimit   = 64 << 10
	maxReplyLimit       = 1 << 20 // NATS's default largest payload
	defaultLocalReplies = 4 << 20
)

// DefaultKeyStrategy reads the Idempotency-Key header, else Nats-Msg-Id.
var DefaultKeyStrategy keys.Strategy = keys.FirstOf(keys.Header("Idempotency-Key"), keys.Header("Nats-Msg-Id"))

// Option configures a Deduper.
type Option func(*config) error

type config struct {
	prefix      string
	logger      *slog.Logger
	forgetBound time.Duration

	meterProvider metric.MeterProvider // nil: metrics off
}

// WithPrefix sets the first segment of every record key (default DefaultPrefix), to
// isolate tenants sharing one Redis. A prefix keys.ValidatePrefix refuses is an error.
func WithPrefix(prefix string) Option {
	return func(c *config) error {
		if err := keys.ValidatePrefix(prefix); err != nil {
			return fmt.Errorf("%w: prefix: %w", ErrInvalidOption, err)
		}
		c.prefix = prefix
		return nil
	}
}

// WithLogger sets the logger for panics, lost leases and the like (default
// slog.Default()). Log lines carry a hash of the key, never the key or the payload.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return fmt.Errorf("%w: logger is nil", ErrInvalidOption)
		}
		c.logger = l
		return nil
	}
}

// MissingKeyPolicy says what Handle does with a message whose key strategy finds no key.
type MissingKeyPolicy uint8

const (
	// RejectMissingKey answers NoKey and does not run fn (the default).
	RejectMissingKey MissingKeyPolicy = iota
	// ProcessMissingKey runs fn without dedup; the result is marked Unguarded.
	ProcessMissingKey
)

// StoreFailurePolicy says what happens when the store cannot answer.
type StoreFailurePolicy uint8

const (
	// FailClosed answers StoreUnavailable and does not run fn (the default).
	FailClosed StoreFailurePolicy = iota
	// FailOpen runs fn without dedup; the result is marked Unguarded.
	FailOpen
	// DatabaseOnly is FailClosed. It once let a transactional run go on with its
	// marker alone when the store failed; transactional runs now claim nothing in
	// the store (DoTx), whatever the policy.
	//
	// Deprecated: use FailClosed.
	DatabaseOnly
)

// Mode says how Handle guards fn.
type Mode uint8

const (
	// ModeDo claims the key with a lease, runs fn, then records DONE (the default).
	ModeDo Mode = iota
	// ModeFilter records DONE first, in one round trip for a new key, and runs fn on
	// first sight only: a crash or a failed fn is not retried.
	ModeFilter
)

// HandlerOption configures one handler at Register.
type HandlerOption func(*handlerConfig) error

type handlerConfig struct {
	retention    time.Duration
	lease        time.Duration
	localSize    int
	localTTL     time.Duration // 0: the retention
	strategy     keys.Strategy
	strategySet  bool // adapters keep a strategy given instead of their default
	missingKey   MissingKeyPolicy
	storeFailure StoreFailurePolicy
	fingerprint  bool
	mode         Mode
	formerNames  []string
	replyLimit   int // 0: replies off
	localReplies int
	localOpts    []lru.Option // for tests
}

func defaultHandlerConfig() handlerConfig {
	return handlerConfig{
		retention:    defaultRetention,
		lease:        defaultLease,
		localSize:    defaultLocalSize,
		strategy:     DefaultKeyStrategy,
		localReplies: defaultLocalReplies,
	}
}

// WithRetention sets how long a DONE record lives (default 24h, at least 1ms). A
// duplicate arriving later runs again: make it longer than the broker redelivers.
func WithRetention(d time.Duration) HandlerOption {
	return func(c *handlerConfig) error {
		if d < time.Millisecond {
			return fmt.Errorf("%w: retention %v is below 1ms", ErrInvalidOption, d)
		}
		c.retention = d
		return nil
	}
}

// WithLease sets how long a claim lives without a heartbeat (default 30s, at least
// 30ms): a consumer that dies holds its key for at most this long.
func WithLease(d time.Duration) HandlerOption {
	return func(c *handlerConfig) error {
		if d < minLease {
			return fmt.Errorf("%w: lease %v is below %v", ErrInvalidOption, d, minLease)
		}
		c.lease = d
		return nil
	}
}

// WithLocalCache sizes the local tier: up to size DONE keys, each kept for ttl
// (default 10,000 keys for the retention). Size 0 turns it off; ttl 0 means the
// retention, and a ttl above it is an error at Register.
func WithLocalCache(size int, ttl time.Duration) HandlerOption {
	return func(c *handlerConfig) error {
		if size < 0 || size > maxLocalSize {
			return fmt.Errorf("%w: local cache size %d is outside 0..%d", ErrInvalidOption, size, maxLocalSize)
		}
		if ttl < 0 {
			return fmt.Errorf("%w: local cache ttl %v is negative", ErrInvalidOption, ttl)
		}
		c.localSize, c.localTTL = size, ttl
		return nil
	}
}

// WithKeyStrategy sets how Handle finds a message's key (default DefaultKeyStrategy).
func WithKeyStrategy(s keys.Strategy) HandlerOption {
	return func(c *handlerConfig) error {
		if s == nil {
			return fmt.Errorf("%w: key strategy is nil", ErrInvalidOption)
		}
		if v, ok := s.(keys.Validator); ok {
			if err := v.Validate(); err != nil {
				return fmt.Errorf("%w: key strategy: %w", ErrInvalidOption, err)
			}
		}
		c.strategy, c.strategySet = s, true
		return nil
	}
}

// WithMissingKey sets what happens to a message without a key (default RejectMissingKey).
func WithMissingKey(p MissingKeyPolicy) HandlerOption {
	return func(c *handlerConfig) error {
		if p > ProcessMissingKey {
			return fmt.Errorf("%w: missing-key policy %d is unknown", ErrInvalidOption, p)
		}
		c.missingKey = p
		return nil
	}
}

// WithStoreFailure sets what happens when the store fails (default FailClosed).
func WithStoreFailure(p StoreFailurePolicy) HandlerOption {
	return func(c *handlerConfig) error {
		if p > DatabaseOnly {
			return fmt.Errorf("%w: store-failure policy %d is unknown", ErrInvalidOption, p)
		}
		c.storeFailure = p
		return nil
	}
}

// WithFingerprint turns payload fingerprinting on or off (default off). When on, a
// DONE key seen again with a different payload answers KeyReuse, not Duplicate.
func WithFingerprint(on bool) HandlerOption {
	return func(c *handlerConfig) error {
		c.fingerprint = on
		return nil
	}
}

// WithMode sets how Handle guards fn (default ModeDo).
func WithMode(m Mode) HandlerOption {
	return func(c *handlerConfig) error {
		if m > ModeFilter {
			return fmt.Errorf("%w: mode %d is unknown", ErrInvalidOption, m)
		}
		c.mode = m
		return nil
	}
}

// WithReplies turns on stored replies (default off; docs/request-reply.md): Run
// stores the reply its fn sets (SetReply) with the DONE record, and duplicates get
// it back in ItemResult.Reply. Do, Handle, Mark, DoTx and RunTx are then refused.
//
// limit is the largest reply stored, in bytes (0 means 64 KiB, at most 1 MiB); a
// larger reply is not stored, and its result, still Processed, has an error wrapping
// ErrReplyTooLarge. Default: off.
func WithReplies(limit int) HandlerOption {
	return func(c *handlerConfig) error {
		if limit < 0 || limit > maxReplyLimit {
			return fmt.Errorf("%w: reply limit %d is outside 0..%d", ErrInvalidOption, limit, maxReplyLimit)
		}
		if limit == 0 {
			limit = defaultReplyLimit
		}
		c.replyLimit = limit
		return nil
	}
}

// WithLocalReplies sets how many bytes of replies the local tier of a handler
// WithReplies keeps (default 4 MiB; 0 keeps none). A reply not kept locally is read
// from the store.
func WithLocalReplies(bytes int) HandlerOption {
	return func(c *handlerConfig) error {
		if bytes < 0 {
			return fmt.Errorf("%w: local replies %d bytes is negative", ErrInvalidOption, bytes)
		}
		c.localReplies = bytes
		return nil
	}
}

func validName(name string) error {
	if err := keys.ValidateName(name); err != nil {
		return fmt.Errorf("%w: handler name: %w", ErrInvalidOption, err)
	}
	return nil
}

func (c *handlerConfig) check() error {
	if c.localTTL == 0 {
		c.localTTL = c.retention
	}
	if c.localTTL > c.retention {
		return fmt.Errorf("%w: local cache ttl %v exceeds retention %v", ErrInvalidOption, c.localTTL, c.retention)
	}
	return nil
}
