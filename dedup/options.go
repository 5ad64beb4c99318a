package dedup

import (
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/dedupkit/dedupkit/keys"
	"github.com/dedupkit/dedupkit/lru"
)

// Defaults for handler settings.
const (
	// DefaultPrefix starts every record key unless WithPrefix says otherwise.
	DefaultPrefix = "dedup"
	// defaultRetention is how long a DONE record is kept.
	defaultRetention = 24 * time.Hour
	// defaultLease is how long an IN PROGRESS claim lives without a heartbeat.
	defaultLease = 30 * time.Second
	// defaultLocalSize is how many DONE keys the local tier holds per handler.
	defaultLocalSize = 10_000
	// minLease is the shortest lease accepted: the heartbeat runs every lease/3.
	minLease = 30 * time.Millisecond
	// maxLocalSize bounds the local tier per handler.
	maxLocalSize = 1 << 24
	// defaultReplyLimit is the largest reply a handler WithReplies(0) stores: 64 KiB.
	defaultReplyLimit = 64 << 10
	// maxReplyLimit bounds WithReplies: 1 MiB, NATS's default largest payload. Every
	// stored reply lives in Redis for the retention: keep replies small.
	maxReplyLimit = 1 << 20
	// defaultLocalReplies is how many bytes of replies a handler's local tier keeps
	// (WithLocalReplies): 4 MiB.
	defaultLocalReplies = 4 << 20
)

// DefaultKeyStrategy reads the Idempotency-Key header, else Nats-Msg-Id.
var DefaultKeyStrategy keys.Strategy = keys.FirstOf(keys.Header("Idempotency-Key"), keys.Header("Nats-Msg-Id"))

// Option configures a Deduper.
type Option func(*config) error

type config struct {
	prefix      string
	logger      *slog.Logger
	forgetBound time.Duration // WithForgetBound (notices.go)

	meterProvider metric.MeterProvider // nil: metrics off (metrics.go)
}

// WithPrefix sets the first segment of every record key (default DefaultPrefix). It
// isolates tenants sharing one Redis. 1 to 64 printable ASCII bytes, without spaces,
// ':' or the glob characters * ? [ ] \ (see keys.ValidatePrefix).
func WithPrefix(prefix string) Option {
	return func(c *config) error {
		if err := keys.ValidatePrefix(prefix); err != nil {
			return fmt.Errorf("%w: prefix: %w", ErrInvalidOption, err)
		}
		c.prefix = prefix
		return nil
	}
}

// WithLogger sets the logger for events such as panics and lost leases (default
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
	// FailClosed answers StoreUnavailable and does not run fn (the default): the message
	// waits for redelivery, and nothing runs twice.
	FailClosed StoreFailurePolicy = iota
	// FailOpen runs fn without dedup; the result is marked Unguarded and counted.
	FailOpen
	// DatabaseOnly is for transactional runs (DoTx, RunTx): when
	// the store fails, the run goes on with its database marker alone, still exactly
	// once (a concurrent copy waits on the marker's row, then finds it committed), but
	// with no lease and no local-tier shortcut for its key. A run without a
	// transaction fails closed.
	DatabaseOnly
)

// Mode says how Handle guards fn.
type Mode uint8

const (
	// ModeDo claims the key with a lease, runs fn, then records DONE (the default). A
	// failed fn releases the claim so a redelivery runs it again.
	ModeDo Mode = iota
	// ModeFilter records DONE first in one round trip and runs fn on first sight only.
	// A crash or a failed fn is not retried: for side effects that are cheap to lose.
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
	strategySet  bool // WithKeyStrategy was given: adapters keep it instead of their default
	missingKey   MissingKeyPolicy
	storeFailure StoreFailurePolicy
	fingerprint  bool
	mode         Mode
	formerNames  []string     // WithFormerNames (former.go)
	replyLimit   int          // WithReplies; 0: replies off
	localReplies int          // WithLocalReplies: bytes of replies the local tier keeps
	localOpts    []lru.Option // for tests: the local tier on a fake clock
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

// WithRetention sets how long a DONE record lives (default 24h, at least
// 1ms). Duplicates arriving later than this run again: make it longer than the broker
// can redeliver.
func WithRetention(d time.Duration) HandlerOption {
	return func(c *handlerConfig) error {
		if d < time.Millisecond {
			return fmt.Errorf("%w: retention %v is below 1ms", ErrInvalidOption, d)
		}
		c.retention = d
		return nil
	}
}

// WithLease sets how long a claim lives without a heartbeat (default 30s, at
// least 30ms). The heartbeat extends it every lease/3 while fn runs; a consumer
// that dies holds the key for at most this long.
func WithLease(d time.Duration) HandlerOption {
	return func(c *handlerConfig) error {
		if d < minLease {
			return fmt.Errorf("%w: lease %v is below %v", ErrInvalidOption, d, minLease)
		}
		c.lease = d
		return nil
	}
}

// WithLocalCache sizes the local tier: up to size DONE keys, each kept for ttl (default
// 10,000 keys for the retention). size 0 turns the tier off; ttl 0 means the
// retention; a ttl above the retention is an error.
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

// WithFingerprint turns payload fingerprinting on or off (default off). When on, Handle
// stores a SHA-256 fingerprint of the payload with the record, and a DONE key seen again
// with a different payload answers KeyReuse instead of Duplicate.
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

// WithReplies turns on stored replies (docs/design.md §10): Run stores the reply its
// fn sets (SetReply) with the DONE record, and a duplicate's ItemResult carries it
// back (Reply), from the store or from the local tier; Run's items then claim
// whatever the mode, and Do, Handle and Mark are ErrInvalidOption. That is what
// request/reply needs: a client that retries after
// a timeout gets the first run's answer, not silence (see the NATS package's
// Replier).
//
// limit is the largest reply stored, in bytes: 0 means 64 KiB, at most
// 1 MiB. A larger reply is not an error for fn: the message is processed,
// its DONE record written without the reply, the result is Processed with fn's
// reply in hand and an error wrapping ErrReplyTooLarge, and it is counted
// (Stats.RepliesTooLarge, dedup.replies.too_large); its duplicates then answer
// Duplicate without a reply (HasReply false). Replies are opaque bytes, never
// logged.
//
// Default: off. A record with a reply has
// a form that processes from before stored replies refuse (as a store failure:
// fail closed), so upgrade every process before turning replies on.
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
// WithReplies keeps (default 4 MiB): each entry counts its key, its
// reply and an overhead (lru.BytesEntryOverhead), and the least recently used go
// first. A duplicate whose reply is not kept locally is answered by the store, which
// has it. 0 keeps none; so does a handler without a local tier (WithLocalCache(0, 0)).
// The entries live as long as the local tier's (WithLocalCache's ttl).
func WithLocalReplies(bytes int) HandlerOption {
	return func(c *handlerConfig) error {
		if bytes < 0 {
			return fmt.Errorf("%w: local replies %d bytes is negative", ErrInvalidOption, bytes)
		}
		c.localReplies = bytes
		return nil
	}
}

// validName checks a handler name, wrapping ErrInvalidOption.
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
