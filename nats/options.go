package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/keys"
)

// ErrRetentionTooShort reports a handler whose DONE records would expire while the
// consumer can still redeliver the message; it wraps dedup.ErrInvalidOption too.
var ErrRetentionTooShort = errors.New("nats: retention shorter than the redelivery horizon")

// Defaults for the adapter's options.
const (
	// DefaultStoreRetryDelay is the NakWithDelay after StoreUnavailable.
	DefaultStoreRetryDelay = time.Second
	// DefaultMinDelay is the shortest NakWithDelay the adapter sends.
	DefaultMinDelay = 50 * time.Millisecond
	// DefaultConcurrency is how many messages a Handler runs at once.
	DefaultConcurrency = 128
	// MaxConcurrency bounds WithConcurrency.
	MaxConcurrency = 4096
	// DefaultRetryAfter is the most a Replier's 503 for a request in progress tells
	// the client to wait (WithRetryAfter).
	DefaultRetryAfter = 500 * time.Millisecond
)

// DefaultBackoff is the NakWithDelay after a handler error: 1s after the first
// delivery, doubling with each delivery, at most one minute.
func DefaultBackoff(numDelivered uint64) time.Duration {
	if numDelivered < 1 {
		numDelivered = 1
	}
	if numDelivered > 7 {
		return time.Minute
	}
	return min(time.Second<<(numDelivered-1), time.Minute)
}

// Option configures an adapter.
type Option func(*config) error

type config struct {
	strategy      keys.Strategy
	backoff       func(numDelivered uint64) time.Duration
	exhausted     func(ctx context.Context, m *Msg, err error)
	doubleAck     bool
	storeRetry    time.Duration
	progressEvery time.Duration // 0: AckWait/3, or never when AckWait is unknown
	maxDeliver    int           // 0 or -1: unknown/unlimited
	unlimited     bool
	concurrency   int
	logger        *slog.Logger
	retryAfter    time.Duration // the most a Replier's 503 tells a client to wait
}

func newConfig(h *dedup.Handler, opts []Option) (config, error) {
	if h == nil {
		return config{}, fmt.Errorf("%w: nats: dedup handler is nil", dedup.ErrInvalidOption)
	}
	c := config{
		strategy: DefaultKeyStrategy, backoff: DefaultBackoff, storeRetry: DefaultStoreRetryDelay,
		concurrency: DefaultConcurrency, logger: slog.Default(), retryAfter: DefaultRetryAfter,
	}
	if s, explicit := h.KeyStrategy(); explicit {
		c.strategy = s
	}
	for _, o := range opts {
		if o == nil {
			return config{}, fmt.Errorf("%w: nats: nil option", dedup.ErrInvalidOption)
		}
		if err := o(&c); err != nil {
			return config{}, err
		}
	}
	return c, nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: nats: "+format, append([]any{dedup.ErrInvalidOption}, args...)...)
}

// WithBackoff sets the NakWithDelay after a handler error, by NumDelivered (default
// DefaultBackoff). A consumer's own BackOff list applies only to messages that are not
// acknowledged at all; a Nak's delay comes from here.
func WithBackoff(f func(numDelivered uint64) time.Duration) Option {
	return func(c *config) error {
		if f == nil {
			return invalid("backoff is nil")
		}
		c.backoff = f
		return nil
	}
}

// WithExhausted sets a hook called when a handler fails on the message's last
// delivery (NumDelivered ≥ MaxDeliver), before the message is terminated: the place
// to dead-letter it. Default: log it.
func WithExhausted(f func(ctx context.Context, m *Msg, err error)) Option {
	return func(c *config) error {
		if f == nil {
			return invalid("exhausted hook is nil")
		}
		c.exhausted = f
		return nil
	}
}

// WithDoubleAck makes Processed and Duplicate wait for the server to confirm the ack
// (default off).
func WithDoubleAck(on bool) Option {
	return func(c *config) error { c.doubleAck = on; return nil }
}

// WithStoreRetryDelay sets the NakWithDelay after StoreUnavailable (default
// DefaultStoreRetryDelay).
func WithStoreRetryDelay(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return invalid("store retry delay %v is not positive", d)
		}
		c.storeRetry = d
		return nil
	}
}

// WithProgressEvery sets how often a running handler's message is marked in progress
// (default AckWait/3 from the consumer's config).
func WithProgressEvery(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return invalid("progress interval %v is not positive", d)
		}
		c.progressEvery = d
		return nil
	}
}

// WithMaxDeliver sets the consumer's MaxDeliver for adapters that cannot read it (core
// and push subscriptions); JetStream consumers read it from their config.
func WithMaxDeliver(n int) Option {
	return func(c *config) error {
		if n == 0 || n < -1 {
			return invalid("max deliver %d is not positive or -1", n)
		}
		c.maxDeliver = n
		return nil
	}
}

// WithUnlimitedRedelivery accepts a consumer with MaxDeliver -1, whose redeliveries
// never end: no retention covers them, so a message redelivered after its record has
// expired runs again.
func WithUnlimitedRedelivery() Option {
	return func(c *config) error { c.unlimited = true; return nil }
}

// WithKeyStrategy sets how a message's key is read (default: the dedup handler's, if
// it was set with dedup.WithKeyStrategy, else DefaultKeyStrategy).
func WithKeyStrategy(s keys.Strategy) Option {
	return func(c *config) error {
		if s == nil {
			return invalid("key strategy is nil")
		}
		if v, ok := s.(keys.Validator); ok {
			if err := v.Validate(); err != nil {
				return invalid("key strategy: %w", err)
			}
		}
		c.strategy = s
		return nil
	}
}

// WithConcurrency sets how many messages a Handler runs at once, 1 to
// MaxConcurrency (default DefaultConcurrency). Above 1 they may finish out of
// order, but two with the same key never run at once in one process; 1 runs them
// one at a time, in delivery order. Handle and HandleBatch run on the caller's
// goroutine regardless.
func WithConcurrency(n int) Option {
	return func(c *config) error {
		if n < 1 || n > MaxConcurrency {
			return invalid("concurrency %d is outside 1..%d", n, MaxConcurrency)
		}
		c.concurrency = n
		return nil
	}
}

// WithRetryAfter sets the longest wait, at least 1ms, that a Replier's 503 for a
// request IN PROGRESS elsewhere tells the client (RetryAfterHeader; default
// DefaultRetryAfter). What is left of the other owner's lease is only an upper
// bound on its run.
func WithRetryAfter(d time.Duration) Option {
	return func(c *config) error {
		if d < time.Millisecond {
			return invalid("retry-after %v is below 1ms", d)
		}
		c.retryAfter = d
		return nil
	}
}

// WithLogger sets the logger for failed acks, terminated and exhausted messages (default
// slog.Default()). Lines name the stream and sequence, never the key or payload.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return invalid("logger is nil")
		}
		c.logger = l
		return nil
	}
}

// CheckRetention reports whether retention outlives every redelivery cfg allows:
// AckWait × MaxDeliver plus the BackOff total (its last value repeated for later
// deliveries, MaxDeliver−1 delays in all). MaxDeliver -1 (unlimited) is an error
// unless unlimited is true. Errors wrap ErrRetentionTooShort (or, for unlimited,
// dedup.ErrInvalidOption) and name the numbers.
func CheckRetention(retention time.Duration, cfg jetstream.ConsumerConfig, unlimited bool) error {
	ackWait := cfg.AckWait
	if ackWait <= 0 {
		ackWait = 30 * time.Second // the server's default
	}
	if cfg.MaxDeliver <= 0 {
		if unlimited {
			return nil
		}
		return invalid("consumer %q has MaxDeliver %d (unlimited): no retention covers its redeliveries; pass WithUnlimitedRedelivery to accept that", cfg.Durable, cfg.MaxDeliver)
	}
	horizon := mulSat(ackWait, cfg.MaxDeliver)
	var backoff time.Duration
	for i := 0; i < cfg.MaxDeliver-1 && len(cfg.BackOff) > 0; i++ {
		backoff = addSat(backoff, cfg.BackOff[min(i, len(cfg.BackOff)-1)])
		if backoff == math.MaxInt64 {
			break
		}
	}
	horizon = addSat(horizon, backoff)
	if retention < horizon {
		return fmt.Errorf("%w: %w: retention %v < AckWait %v × MaxDeliver %d + BackOff total %v = %v",
			ErrRetentionTooShort, dedup.ErrInvalidOption, retention, ackWait, cfg.MaxDeliver, backoff, horizon)
	}
	return nil
}

func mulSat(d time.Duration, n int) time.Duration {
	if d > 0 && int64(n) > math.MaxInt64/int64(d) {
		return math.MaxInt64
	}
	return d * time.Duration(n)
}

func addSat(a, b time.Duration) time.Duration {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
