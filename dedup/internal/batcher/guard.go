// Package batcher is the store as the dedup engine calls it (docs/design.md §3): one
// queue per store operation merges the calls of every caller into pipelines, each
// caller returns by its own deadline whatever the client does, and a breaker fails
// claims and marks at once while the store is known down.
package batcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/internal/storekit"
)

// Store is the guarded store. A call returns by its context's deadline, or once
// Config.Abandon is closed, whatever the client does; a claim that lands after its
// caller gave up is given back. After BreakerTrip store failures in a row, claims
// and marks fail at once until a probe gets an answer. Completions, releases and
// extensions are always tried: they settle what has run.
type Store struct {
	s      driver.Store
	cfg    Config
	detach bool // calls run on a goroutine of their own: the store is not in-process
	// honours: the store ends a call by its context's deadline or its client's
	// timeouts (HonoursDeadlines): a lone claim or mark goes from its caller's goroutine
	honours bool

	claims, marks, completes, extends, releases *queue

	fails  atomic.Int32 // store failures in a row
	open   atomic.Bool
	probes sync.WaitGroup // the probe goroutine; Wait waits for it
	// probeMu guards waiting: Wait has begun, and no probe may start
	probeMu sync.Mutex
	waiting bool
	// opened is closed when the breaker opens: claims and marks still waiting give up
	opened atomic.Pointer[chan struct{}]
	retry  retries // completions to send again (retry.go)
}

// Config is what the guard needs from its Deduper.
type Config struct {
	Logger *slog.Logger
	// Closing ends with the Deduper: the probe stops.
	Closing context.Context
	// Abandon is closed when Close stops waiting for the store calls still out.
	Abandon <-chan struct{}
	// Ping asks whether the store answers (the breaker's probe).
	Ping func(context.Context) error
	// Base is the store below any wrapper (the meter's): whether it is in-process, or
	// honours deadlines, is its own.
	Base driver.Store
}

// A store that reports HonoursDeadlines true ends every call by its context's
// deadline, or by its client's timeouts at the latest, whatever its network does
// (redisstore over a go-redis client with ContextTimeoutEnabled and read and write
// timeouts). While the store answers, a claim or mark with nothing else queued or out
// then goes from its caller's goroutine, which saves a goroutine hand-off each way
// (the bench's c1 latency). Such a call, once sent, is not cut short by a
// cancellation, by Close or by the breaker: by its deadline or the client's timeouts.
type deadlineHonourer interface{ HonoursDeadlines() bool }

const (
	// BreakerTrip is how many store failures in a row open the breaker.
	BreakerTrip = 3
	// The probe tries after probeFirst, then at doubling intervals up to probeMax.
	probeFirst = 50 * time.Millisecond
	probeMax   = time.Second
	// StallAfter is how long a claim or mark may go unanswered before it counts as a
	// store failure for the breaker (it goes on waiting; any answer resets the count).
	StallAfter = 250 * time.Millisecond
	// ReleaseTimeout bounds a best-effort release.
	ReleaseTimeout = 2 * time.Second
)

// ErrBreakerOpen is the cause of a call refused while the breaker is open.
var ErrBreakerOpen = errors.New("dedup: store known down (breaker open); probing it in the background")

// New guards s.
func New(s driver.Store, cfg Config) *Store {
	base := cfg.Base
	if base == nil {
		base = s
	}
	h, _ := base.(deadlineHonourer)
	g := &Store{s: s, cfg: cfg, detach: !storekit.IsInProcess(base), honours: h != nil && h.HonoursDeadlines()}
	// claims and marks are refused while the breaker is open; the others settle what
	// has run, and are always tried
	g.claims = newQueue(g, "claim", true, s.Claim)
	g.claims.giveBack = true
	g.marks = newQueue(g, "mark", true, s.Mark)
	g.completes = newQueue(g, "complete", false, asAnswers(s.Complete))
	g.completes.retry = true
	g.extends = newQueue(g, "extend", false, asAnswers(s.Extend))
	g.releases = newQueue(g, "release", false, asAnswers(s.Release))
	c := make(chan struct{})
	g.opened.Store(&c)
	return g
}

// Unwrap returns the store it guards.
func (g *Store) Unwrap() driver.Store { return g.s }

// Wait waits for the probe goroutine, the completions' retries and the idle flushers,
// which end with Config.Closing.
func (g *Store) Wait() {
	g.probeMu.Lock()
	g.waiting = true
	g.probeMu.Unlock()
	g.probes.Wait()
	g.waitRetries()
	for _, q := range []*queue{g.claims, g.marks, g.completes, g.extends, g.releases} {
		q.waitIdle()
	}
}

// Quiet returns a guard of g's store whose calls the breaker does not count: for the
// probe and the health check.
func (g *Store) Quiet() *Store { return &Store{s: g.s, cfg: g.cfg, detach: g.detach} }

// Open reports whether the breaker is open.
func (g *Store) Open() bool { return g.open.Load() }

type waitKey struct{}

// Settle returns the context of a call that settles a run after fn returned (a
// completion, a release): sent whatever ctx says and ending after d, but waited for
// only until ctx's deadline plus SettleGrace, so that the caller returns by it.
func Settle(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	dl, ok := ctx.Deadline()
	if !ok {
		return bg, cancel
	}
	bound, stop := context.WithDeadline(context.Background(), dl.Add(SettleGrace))
	return WaitBounded(bg, bound), func() { stop(); cancel() }
}

// SettleGrace is how long past the caller's deadline a settling call is waited for:
// a store that answers at all answers in far less.
const SettleGrace = 50 * time.Millisecond

// WaitBounded returns ctx, whose calls the guard waits for only while bound lasts.
func WaitBounded(ctx, bound context.Context) context.Context {
	if bound.Done() == nil {
		return ctx
	}
	return context.WithValue(ctx, waitKey{}, bound)
}

// boundOf is the context whose end a call on ctx is waited for no longer than.
func boundOf(ctx context.Context) context.Context {
	if b, ok := ctx.Value(waitKey{}).(context.Context); ok {
		return b
	}
	return ctx
}

// Detached runs f, the store call op, on a goroutine of its own (unless the store is
// in-process) and returns its answer, or an error wrapping ErrStoreUnavailable once
// ctx (or its wait bound) ends or Abandon is closed; f's answer then goes unread.
// The records operations and the health check use it; the others go through the
// batcher.
func Detached[T any](g *Store, ctx context.Context, op string, f func(context.Context) (T, error)) (T, error) {
	if !g.detach {
		v, err := f(ctx)
		g.note(ctx, false, err)
		return v, err
	}
	var zero T
	if err := ctx.Err(); err != nil { // the store would not send it either
		return zero, fmt.Errorf("%w: %s: not sent: %w", driver.ErrStoreUnavailable, op, context.Cause(ctx))
	}
	var v T
	var err error
	done := make(chan struct{})
	go func() {
		v, err = f(ctx)
		close(done)
	}()
	if cause := g.wait(done, boundOf(ctx), false); cause != nil {
		select {
		case <-done: // answered meanwhile: the answer wins
		default:
			return zero, fmt.Errorf("%w: %s: no answer: %w", driver.ErrStoreUnavailable, op, cause)
		}
	}
	g.note(ctx, false, err)
	return v, err
}

// wait waits for done and returns nil, or what ended the wait first: bound's end,
// Abandon (ErrClosed), or, for a claim or mark (entry), the breaker opening (a store
// call of claims or marks unanswered after StallAfter counts: queue.flush).
func (g *Store) wait(done <-chan struct{}, bound context.Context, entry bool) error {
	var opened <-chan struct{} // nil (never) unless a claim or mark may give up on the breaker
	if entry {
		opened = *g.opened.Load()
	}
	select {
	case <-done:
		return nil
	case <-bound.Done():
		return context.Cause(bound)
	case <-g.cfg.Abandon:
		return driver.ErrClosed
	case <-opened:
		return ErrBreakerOpen
	}
}

// note counts a failed entry call for the breaker; any answer resets the count.
func (g *Store) note(ctx context.Context, entry bool, err error) {
	switch {
	case err == nil || !errors.Is(err, driver.ErrStoreUnavailable): // the store answered
		g.fails.Store(0)
	case !entry:
	case ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded):
		// the caller gave up (shutdown): says nothing about the store
	default:
		g.failed()
	}
}

// stalled returns what a store call of n callers' claims or marks, unanswered after
// StallAfter, counts: a failure per caller (it goes on waiting; any answer resets the
// count). A caller without a deadline would otherwise wait out the client's retries
// (go-redis's dial retries: about 1.7 s per command with its defaults) before the
// breaker heard of an outage.
func (g *Store) stalled(n int) func() {
	return func() {
		for range n {
			g.failed() // may open the breaker: the callers' waits end then
		}
	}
}

// failed counts one store failure and opens the breaker at BreakerTrip in a row.
func (g *Store) failed() {
	if g.fails.Add(1) >= BreakerTrip && g.open.CompareAndSwap(false, true) {
		close(*g.opened.Load()) // the claims and marks still out give up
		g.cfg.Logger.Warn("dedup: store not answering; claims and marks fail at once (FailOpen handlers and transactional runs go on without it) until a probe gets an answer", "failures", BreakerTrip)
		// a stall timer may fire as Close waits: no probe starts once Wait has begun
		g.probeMu.Lock()
		if !g.waiting {
			g.probes.Add(1)
			go g.probe()
		}
		g.probeMu.Unlock()
	}
}

// refused is the error of a claim or mark while the breaker is open; nil otherwise.
func (g *Store) refused(op string) error {
	if !g.open.Load() {
		return nil
	}
	return fmt.Errorf("%w: %s: %w", driver.ErrStoreUnavailable, op, ErrBreakerOpen)
}

// probe asks the store at growing intervals until it answers or Closing ends.
func (g *Store) probe() {
	defer g.probes.Done()
	every := probeFirst
	for {
		t := time.NewTimer(every)
		select {
		case <-g.cfg.Closing.Done():
			t.Stop()
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(g.cfg.Closing, probeMax)
		_, err := Detached(g.Quiet(), ctx, "probe", func(ctx context.Context) (struct{}, error) {
			return struct{}{}, g.cfg.Ping(ctx)
		})
		cancel()
		if err == nil {
			// completions first, so that the claims the breaker let in find their DONE
			rctx, rcancel := context.WithTimeout(g.cfg.Closing, probeMax)
			g.retryNow(rctx)
			rcancel()
			g.retryWake()
			g.fails.Store(0)
			c := make(chan struct{})
			g.opened.Store(&c)
			g.open.Store(false)
			g.cfg.Logger.Info("dedup: store answers again; breaker closed")
			return
		}
		every = min(2*every, probeMax)
	}
}

// Claim implements driver.Store; claims that land after their caller gave up are
// given back.
func (g *Store) Claim(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	return g.claims.do(ctx, entries)
}

// Mark implements driver.Store. A mark given up on may have written DONE, as in a
// crash.
func (g *Store) Mark(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	return g.marks.do(ctx, entries)
}

// Complete implements driver.Store.
func (g *Store) Complete(ctx context.Context, entries []driver.Entry) ([]error, error) {
	return errsOf(g.completes.do(ctx, entries))
}

// Extend implements driver.Store.
func (g *Store) Extend(ctx context.Context, entries []driver.Entry) ([]error, error) {
	return errsOf(g.extends.do(ctx, entries))
}

// Release implements driver.Store.
func (g *Store) Release(ctx context.Context, entries []driver.Entry) ([]error, error) {
	return errsOf(g.releases.do(ctx, entries))
}

func errsOf(as []driver.Answer, err error) ([]error, error) {
	if err != nil {
		return nil, err
	}
	errs := make([]error, len(as))
	for i, a := range as {
		errs[i] = a.Err
	}
	return errs, nil
}

// Lookup implements driver.RecordStore when the store below does (the caller checks).
func (g *Store) Lookup(ctx context.Context, keys []string) ([]driver.Record, error) {
	return Detached(g, ctx, "lookup", func(ctx context.Context) ([]driver.Record, error) {
		return g.s.(driver.RecordStore).Lookup(ctx, keys)
	})
}

// Forget implements driver.RecordStore when the store below does (the caller checks).
func (g *Store) Forget(ctx context.Context, keys []string, force bool) ([]driver.Record, error) {
	return Detached(g, ctx, "forget", func(ctx context.Context) ([]driver.Record, error) {
		return g.s.(driver.RecordStore).Forget(ctx, keys, force)
	})
}

// CountRecords implements driver.RecordStore when the store below does.
func (g *Store) CountRecords(ctx context.Context, prefix, handler string) (map[string]int64, error) {
	return Detached(g, ctx, "count", func(ctx context.Context) (map[string]int64, error) {
		return g.s.(driver.RecordStore).CountRecords(ctx, prefix, handler)
	})
}

// giveBack releases claims that landed after their caller gave up on them.
func (g *Store) giveBack(entries []driver.Entry) {
	if len(entries) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), ReleaseTimeout)
	_, _ = g.s.Release(ctx, entries)
	cancel()
}

// CheckHealth is hc's checks, or CheckStoreReachable failed when they are not in by
// ctx's deadline plus SettleGrace, which lets a store that honours ctx report its
// own. The breaker does not count it.
func (g *Store) CheckHealth(ctx context.Context, hc driver.HealthChecker) []driver.HealthCheck {
	wait := ctx
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		wait, cancel = context.WithDeadline(context.WithoutCancel(ctx), dl.Add(SettleGrace))
		defer cancel()
	}
	checks, err := Detached(g.Quiet(), WaitBounded(ctx, wait), "health", func(ctx context.Context) ([]driver.HealthCheck, error) {
		return hc.CheckHealth(ctx), nil
	})
	if err != nil {
		return []driver.HealthCheck{{Name: driver.CheckStoreReachable, Status: driver.HealthFail, Detail: err.Error()}}
	}
	return checks
}
