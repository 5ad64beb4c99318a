package dedup

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/internal/batcher"
	"github.com/dedupkit/dedupkit/dedup/internal/former"
	"github.com/dedupkit/dedupkit/dedup/internal/meter"
	"github.com/dedupkit/dedupkit/dedup/internal/notices"
	"github.com/dedupkit/dedupkit/internal/storekit"
	"github.com/dedupkit/dedupkit/lru"
)

// Deduper guards message handlers with a Store: one Handler per name. It is safe
// for concurrent use.
type Deduper struct {
	store driver.Store   // base behind the guard, and metered when metrics are on
	g     *batcher.Store // store's guard and batcher
	cfg   config
	base  driver.Store   // the store given to New
	met   *meter.Metrics // nil: metrics off

	ctx    context.Context // cancelled by Close, and with it every running fn
	cancel context.CancelCauseFunc

	mu       sync.RWMutex
	closed   bool
	running  sync.WaitGroup // calls that reached the store; Close waits for them
	quiet    chan struct{}  // closed once they have ended: the lease tables stop
	handlers map[string]*Handler
	byName   map[string]*Handler // handlers with a local tier, by name and former names
	notices  *notices.Listener   // nil until a handler with a local tier registers
	// abandon ends closeWait after Close began (giveUp): store calls still out are given up
	abandon context.Context
	giveUp  context.CancelFunc
}

// New returns a Deduper over store. A nil store or a bad option is an error wrapping
// ErrInvalidOption.
func New(store driver.Store, opts ...Option) (*Deduper, error) {
	if storekit.IsNil(store) { // a nil interface, or a nil *Store from a failed constructor
		return nil, fmt.Errorf("%w: store is nil", ErrInvalidOption)
	}
	cfg := config{prefix: DefaultPrefix, logger: slog.Default(), forgetBound: defaultForgetBound}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil Option", ErrInvalidOption)
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	d := &Deduper{store: store, base: store, cfg: cfg, ctx: ctx, cancel: cancel,
		handlers: make(map[string]*Handler), byName: make(map[string]*Handler), quiet: make(chan struct{})}
	d.abandon, d.giveUp = context.WithCancel(context.Background())
	if err := d.instrument(); err != nil {
		cancel(err)
		return nil, err
	}
	d.g = batcher.New(d.store, batcher.Config{Logger: cfg.logger, Closing: ctx, Abandon: d.abandon.Done(), Ping: d.ping, Base: store})
	d.store = d.g
	return d, nil
}

// Register adds a handler. Its name, 1 to 64 bytes of [A-Za-z0-9._-], is part of
// every record key: keep it stable across deploys, or rename with WithFormerNames.
// A bad name or option, or a name taken, wraps ErrInvalidOption; after Close, ErrClosed.
func (d *Deduper) Register(name string, opts ...HandlerOption) (*Handler, error) {
	if d == nil {
		return nil, fmt.Errorf("%w: nil *Deduper (did New fail?)", ErrInvalidOption)
	}
	if d.handlers == nil {
		return nil, fmt.Errorf("%w: a Deduper not made by New", ErrInvalidOption)
	}
	if err := validName(name); err != nil {
		return nil, err
	}
	cfg := defaultHandlerConfig()
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: handler %q: nil HandlerOption", ErrInvalidOption, name)
		}
		if err := o(&cfg); err != nil {
			return nil, fmt.Errorf("handler %q: %w", name, err)
		}
	}
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("handler %q: %w", name, err)
	}
	h := &Handler{
		d: d, name: name, cfg: cfg, flights: newFlights(), store: d.store,
		keyHead: d.cfg.prefix + ":" + name + ":",
		log:     d.cfg.logger.With("handler", name),
		met:     d.met.Handler(name),
	}
	h.leases.h = h
	if len(cfg.formerNames) > 0 {
		rs, err := d.records()
		if err != nil {
			return nil, fmt.Errorf("%w: handler %q: former names need a store that can look up records: %w", ErrInvalidOption, name, err)
		}
		for _, n := range cfg.formerNames {
			h.formerHeads = append(h.formerHeads, d.cfg.prefix+":"+n+":")
		}
		h.store = &former.Store{Store: d.store, Records: rs, Head: h.keyHead, Formers: h.formerHeads,
			Log: h.log, Wait: min(cfg.lease, batcher.ReleaseTimeout)}
	}
	if cfg.localSize > 0 {
		c, err := lru.New(cfg.localSize, cfg.localTTL, cfg.localOpts...)
		if err != nil {
			return nil, fmt.Errorf("%w: handler %q: local cache: %w", ErrInvalidOption, name, err)
		}
		h.local = c
		if cfg.replyLimit > 0 && cfg.localReplies > 0 {
			if h.replies, err = lru.NewBytes(int64(cfg.localReplies), cfg.localTTL, cfg.localOpts...); err != nil {
				c.Close()
				return nil, fmt.Errorf("%w: handler %q: local replies: %w", ErrInvalidOption, name, err)
			}
		}
	}
	if err := d.add(h); err != nil {
		h.closeLocal()
		return nil, err
	}
	d.watchNotices(h)
	return h, nil
}

func (d *Deduper) add(h *Handler) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	if _, dup := d.handlers[h.name]; dup {
		return fmt.Errorf("%w: handler %q is already registered", ErrInvalidOption, h.name)
	}
	if err := d.checkFormerNames(h); err != nil {
		return err
	}
	d.handlers[h.name] = h
	if h.local != nil {
		for _, n := range h.names() {
			d.byName[n] = h
		}
	}
	return nil
}

// Handlers returns the registered handler names, sorted.
func (d *Deduper) Handlers() []string {
	if d == nil {
		return nil
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	names := make([]string, 0, len(d.handlers))
	for n := range d.handlers {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Store returns the store the Deduper was built with.
func (d *Deduper) Store() driver.Store {
	if d == nil {
		return nil
	}
	return d.base
}

// Close cancels running fns (cause ErrClosed), answers later calls Cancelled with
// ErrClosed, and waits for the calls to end, giving up on store calls after 1s. A fn
// that ignores its context delays Close. It does not close the store. Idempotent.
func (d *Deduper) Close() error {
	if d == nil || d.handlers == nil {
		return nil
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	d.cancel(ErrClosed)
	giveUp := time.AfterFunc(closeWait, d.giveUp)
	notices := make(chan struct{})
	go func() { // beside the wait, so Close's bound stays closeWait
		d.stopNotices()
		close(notices)
	}()
	d.running.Wait()
	giveUp.Stop()
	close(d.quiet)
	<-notices
	d.g.Wait() // the breaker's probe ends with d.ctx
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, h := range d.handlers {
		h.leases.wait()
		h.closeLocal()
	}
	return nil
}

// closeWait is how long Close waits for the answers of store calls in flight.
const closeWait = batcher.CloseWait

// ping is the breaker's probe: the store's Ping, or a release of a key nobody holds.
func (d *Deduper) ping(ctx context.Context) error {
	if p, ok := d.base.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	// the store under the guard: metered, when metrics are on
	_, err := d.g.Unwrap().Release(ctx, []driver.Entry{{Key: d.cfg.prefix + ":\x00probe", Token: "probe"}})
	return err
}

// Breaker reports whether the Deduper's store breaker is open: calls failed in a
// row, so claims and marks fail at once while a goroutine probes the store.
func (d *Deduper) Breaker() (open bool) { return d != nil && d.g != nil && d.g.Open() }

// enter registers a call that will reach the store; false once Close has begun.
func (d *Deduper) enter() bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return false
	}
	d.running.Add(1)
	return true
}
