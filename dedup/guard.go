package dedup

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/internal/storekit"
)

// guard is the store as the engine calls it (docs/design.md §3). A call returns by
// its context's deadline, or within closeWait of Close, whatever the client does; a
// claim that lands after its caller gave up is given back. A breaker fails claims and
// marks at once after breakerTrip failures in a row, until a probe gets an answer.
// Completions, releases and extensions are always tried: they settle what has run.
type guard struct {
	s      driver.Store
	d      *Deduper
	detach bool // calls run on a goroutine of their own (see detaches)

	// the batcher (batcher.go): one queue per operation
	claims, marks, completes, extends, releases *queue

	fails  atomic.Int32 // store failures in a row
	open   atomic.Bool
	probes sync.WaitGroup // the probe goroutine; Close waits for it
	// opened is closed when the breaker opens: claims and marks still waiting give up
	opened atomic.Pointer[chan struct{}]
}

const (
	// breakerTrip is how many store failures in a row open the breaker.
	breakerTrip = 3
	// The probe tries after probeFirst, then at doubling intervals up to probeMax.
	probeFirst = 50 * time.Millisecond
	probeMax   = time.Second
	// closeWait is how long Close waits for the answers of store calls in flight.
	closeWait = time.Second
)

// errBreakerOpen is the cause of a call refused while the breaker is open.
var errBreakerOpen = errors.New("dedup: store known down (breaker open); probing it in the background")

func newGuard(d *Deduper, s driver.Store) *guard {
	g := &guard{s: s, d: d, detach: detaches(d.base)}
	// claims and marks are refused while the breaker is open; the others settle what
	// has run, and are always tried
	g.claims = newQueue(g, "claim", true, s.Claim)
	g.claims.giveBack = true
	g.marks = newQueue(g, "mark", true, s.Mark)
	g.completes = newQueue(g, "complete", false, asAnswers(s.Complete))
	g.extends = newQueue(g, "extend", false, asAnswers(s.Extend))
	g.releases = newQueue(g, "release", false, asAnswers(s.Release))
	c := make(chan struct{})
	g.opened.Store(&c)
	return g
}

// detaches reports whether calls to s need a goroutine of their own: not in-process.
func detaches(s driver.Store) bool {
	return !storekit.IsInProcess(s)
}

type waitKey struct{}

// settleCtx returns the context of a call that settles a run after fn returned (a
// completion, a release): sent whatever ctx says and ending after d, but waited for
// only until ctx's deadline plus settleGrace, so that the caller returns by it.
func (h *Handler) settleCtx(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	dl, ok := ctx.Deadline()
	if !ok {
		return bg, cancel
	}
	bound, stop := context.WithDeadline(context.Background(), dl.Add(settleGrace))
	return waitBounded(bg, bound), func() { stop(); cancel() }
}

// settleGrace is how long past the caller's deadline a settling call is waited for:
// a store that answers at all answers in far less.
const settleGrace = 50 * time.Millisecond

// waitBounded returns ctx, whose calls the guard waits for only while bound lasts.
func waitBounded(ctx, bound context.Context) context.Context {
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

// detached runs f, the store call op, on a goroutine of its own and returns its
// answer, or an error wrapping ErrStoreUnavailable once ctx (or its wait bound) ends
// or Close has waited closeWait; f's answer then goes unread. The records
// operations, the health check and the probe use it; the others go through the
// batcher.
func detached[T any](g *guard, ctx context.Context, op string, f func(context.Context) (T, error)) (T, error) {
	if !g.detach {
		v, err := f(ctx)
		g.note(ctx, false, err)
		return v, err
	}
	var zero T
	if err := ctx.Err(); err != nil { // the store would not send it either
		return zero, fmt.Errorf("%w: %s: not sent: %w", ErrStoreUnavailable, op, context.Cause(ctx))
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
			return zero, fmt.Errorf("%w: %s: no answer: %w", ErrStoreUnavailable, op, cause)
		}
	}
	g.note(ctx, false, err)
	return v, err
}

// wait waits for done and returns nil, or what ended the wait first: bound's end,
// Close's abandon (ErrClosed), or, for a claim or mark (entry), the breaker opening.
func (g *guard) wait(done <-chan struct{}, bound context.Context, entry bool) error {
	var opened <-chan struct{} // nil (never) unless a claim or mark may give up on the breaker
	if entry {
		opened = *g.opened.Load()
	}
	select {
	case <-done:
		return nil
	case <-bound.Done():
		return context.Cause(bound)
	case <-g.d.abandon:
		return ErrClosed
	case <-opened:
		return errBreakerOpen
	}
}

// note counts a failed entry call for the breaker; any answer resets the count.
func (g *guard) note(ctx context.Context, entry bool, err error) {
	switch {
	case err == nil || !errors.Is(err, ErrStoreUnavailable): // the store answered
		g.fails.Store(0)
	case !entry:
	case ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded):
		// the caller gave up (shutdown): says nothing about the store
	default:
		g.failed()
	}
}

// failed counts one store failure and opens the breaker at breakerTrip in a row.
func (g *guard) failed() {
	if g.fails.Add(1) >= breakerTrip && g.open.CompareAndSwap(false, true) {
		close(*g.opened.Load()) // the claims and marks still out give up
		g.d.cfg.logger.Warn("dedup: store not answering; claims and marks fail at once (handlers FailOpen and DatabaseOnly go on without it) until a probe gets an answer", "failures", breakerTrip)
		g.probes.Add(1)
		go g.probe()
	}
}

// refused is the error of a claim or mark while the breaker is open; nil otherwise.
func (g *guard) refused(op string) error {
	if !g.open.Load() {
		return nil
	}
	return fmt.Errorf("%w: %s: %w", ErrStoreUnavailable, op, errBreakerOpen)
}

// probe asks the store at growing intervals until it answers or the Deduper closes.
func (g *guard) probe() {
	defer g.probes.Done()
	every := probeFirst
	for {
		t := time.NewTimer(every)
		select {
		case <-g.d.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(g.d.ctx, probeMax)
		_, err := detached(&guard{s: g.s, d: g.d, detach: g.detach}, ctx, "probe", func(ctx context.Context) (struct{}, error) {
			return struct{}{}, g.ping(ctx)
		})
		cancel()
		if err == nil {
			g.fails.Store(0)
			c := make(chan struct{})
			g.opened.Store(&c)
			g.open.Store(false)
			g.d.cfg.logger.Info("dedup: store answers again; breaker closed")
			return
		}
		every = min(2*every, probeMax)
	}
}

func (g *guard) ping(ctx context.Context) error {
	if p, ok := g.d.base.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	_, err := g.s.Release(ctx, []driver.Entry{{Key: g.d.cfg.prefix + ":\x00probe", Token: "probe"}})
	return err
}

// Breaker reports whether the Deduper's store breaker is open: calls failed in a
// row, so claims and marks fail at once while a goroutine probes the store.
func (d *Deduper) Breaker() (open bool) {
	if d == nil {
		return false
	}
	g, ok := d.store.(*guard)
	return ok && g.open.Load()
}

// Claim implements Store; claims that land after their caller gave up are given back.
func (g *guard) Claim(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	return g.claims.do(ctx, entries)
}

// Mark implements Store. A mark given up on may have written DONE, as in a crash.
func (g *guard) Mark(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	return g.marks.do(ctx, entries)
}

// Complete implements Store.
func (g *guard) Complete(ctx context.Context, entries []driver.Entry) ([]error, error) {
	return errsOf(g.completes.do(ctx, entries))
}

// Extend implements Store.
func (g *guard) Extend(ctx context.Context, entries []driver.Entry) ([]error, error) {
	return errsOf(g.extends.do(ctx, entries))
}

// Release implements Store.
func (g *guard) Release(ctx context.Context, entries []driver.Entry) ([]error, error) {
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

// Lookup implements RecordStore when the store below does (Deduper.records checks).
func (g *guard) Lookup(ctx context.Context, keys []string) ([]driver.Record, error) {
	return detached(g, ctx, "lookup", func(ctx context.Context) ([]driver.Record, error) {
		return g.s.(driver.RecordStore).Lookup(ctx, keys)
	})
}

// Forget implements RecordStore when the store below does (Deduper.records checks).
func (g *guard) Forget(ctx context.Context, keys []string, force bool) ([]driver.Record, error) {
	return detached(g, ctx, "forget", func(ctx context.Context) ([]driver.Record, error) {
		return g.s.(driver.RecordStore).Forget(ctx, keys, force)
	})
}

// CountRecords implements RecordStore when the store below does.
func (g *guard) CountRecords(ctx context.Context, prefix, handler string) (map[string]int64, error) {
	return detached(g, ctx, "count", func(ctx context.Context) (map[string]int64, error) {
		return g.s.(driver.RecordStore).CountRecords(ctx, prefix, handler)
	})
}

// giveBack releases claims that landed after their caller gave up on them.
func (g *guard) giveBack(entries []driver.Entry) {
	if len(entries) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	_, _ = g.s.Release(ctx, entries)
	cancel()
}
