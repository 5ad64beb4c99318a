package dedup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/dedupkit/dedupkit/keys"
	"github.com/dedupkit/dedupkit/lru"
)

// Handler guards one handler's messages: each key runs successfully at most once
// inside the retention. Get one from Deduper.Register. Safe for concurrent use.
type Handler struct {
	d       *Deduper
	name    string
	cfg     handlerConfig
	local   *lru.Cache // DONE keys only; nil when the tier is off
	flights *flights
	keyHead string // "<prefix>:<name>:", the head of every record key
	log     *slog.Logger
	stats   counters
}

// Name returns the handler's name.
func (h *Handler) Name() string { return h.name }

// Retention returns how long a DONE record of this handler lives.
func (h *Handler) Retention() time.Duration { return h.cfg.retention }

// Lease returns the handler's lease.
func (h *Handler) Lease() time.Duration { return h.cfg.lease }

// Mode returns how Handle guards fn.
func (h *Handler) Mode() Mode { return h.cfg.mode }

// KeyStrategy returns the handler's key strategy, and whether it was set with
// WithKeyStrategy (adapters put their own default in place of DefaultKeyStrategy).
func (h *Handler) KeyStrategy() (s keys.Strategy, explicit bool) {
	return h.cfg.strategy, h.cfg.strategySet
}

// RecordKey returns the store key that holds key's record for this handler.
func (h *Handler) RecordKey(key string) string {
	return keys.RecordKey(h.d.cfg.prefix, h.name, key)
}

// Do runs fn once for key: it claims key with a lease, runs fn while a heartbeat
// extends the lease every lease/3, then records DONE. fn's context is cancelled, with
// cause ErrLeaseLost, if the lease is lost, and with cause ErrClosed on Close.
//
// The Result says what happened (see Outcome). The error is nil for Processed,
// Duplicate, InProgress, NoKey and KeyReuse; for Failed it is fn's error as is; for the
// other outcomes it wraps ErrPanic, ErrStoreUnavailable, ErrNotRecorded, ErrLeaseLost,
// ErrClosed or the context's error. An empty key follows the missing-key policy.
func (h *Handler) Do(ctx context.Context, key string, fn func(context.Context) error) (Result, error) {
	if key == "" {
		return h.noKey(ctx, fn)
	}
	return h.do(ctx, key, "", fn)
}

// Mark is filter mode: one round trip that records key as DONE and answers First the
// first time, Duplicate afterwards (KeyReuse never, as Mark carries no payload). There
// is no lease: run the side effect after First, accepting that a crash loses it. An
// empty key answers NoKey, or First with Unguarded under ProcessMissingKey. A store
// failure answers StoreUnavailable, or First with Unguarded under FailOpen.
func (h *Handler) Mark(ctx context.Context, key string) (Result, error) {
	if key == "" {
		return h.noKey(ctx, nil)
	}
	res, err := h.mark(ctx, key, "")
	if res.Outcome == First {
		h.count(res)
	}
	return res, err
}

// Handle reads msg's key with the handler's key strategy and guards fn by the
// handler's mode: ModeDo as Do, ModeFilter as Mark then fn on First. With
// fingerprinting on, the payload's fingerprint is stored and compared (KeyReuse).
func (h *Handler) Handle(ctx context.Context, msg keys.Message, fn func(context.Context) error) (Result, error) {
	return h.HandleKey(ctx, h.cfg.strategy.Key(msg), msg.Data(), fn)
}

// HandleKey is Handle for a key the caller has already read from the message (an
// adapter with its own key strategy); payload is fingerprinted when fingerprinting is on.
func (h *Handler) HandleKey(ctx context.Context, key string, payload []byte, fn func(context.Context) error) (Result, error) {
	if key == "" {
		return h.noKey(ctx, fn)
	}
	fp := h.fingerprint(payload)
	if h.cfg.mode == ModeDo {
		return h.do(ctx, key, fp, fn)
	}
	res, err := h.mark(ctx, key, fp)
	if res.Outcome != First {
		return res, err
	}
	return h.runPlain(ctx, fn, res.Unguarded)
}

// Fingerprint returns the payload fingerprint stored with records when fingerprinting
// is on: the hex of the first 16 bytes of the payload's SHA-256.
func Fingerprint(payload []byte) string {
	sum := sha256.Sum256(payload)
	return hex.EncodeToString(sum[:16])
}

func (h *Handler) fingerprint(payload []byte) string {
	if !h.cfg.fingerprint {
		return ""
	}
	return Fingerprint(payload)
}

// localKey is what the local tier holds: the key, and the fingerprint when there is
// one, so that a reused key with another payload misses locally and reaches the store.
// '#' is in neither of keys.Normalize's forms, so the join is unambiguous.
func localKey(k, fp string) string {
	if fp == "" {
		return k
	}
	return k + "#" + fp
}

func (h *Handler) remember(lk string) {
	if h.local != nil {
		h.local.Add(lk)
	}
}

func (h *Handler) closeLocal() {
	if h.local != nil {
		h.local.Close()
	}
}

// check answers from the local tier or from a concurrent call for the same key. It
// returns the flight the caller leads when neither could answer.
func (h *Handler) check(ctx context.Context, k, lk, fp string) (*flight, Result, error) {
	if h.local != nil && h.local.Contains(lk) {
		return nil, h.count(Result{Outcome: Duplicate, Tier: TierLocal}), nil
	}
	f, lead := h.flights.join(k)
	if lead {
		f.fp = fp
		return f, Result{}, nil
	}
	select {
	case <-f.ready:
	case <-ctx.Done():
		return nil, h.count(Result{Outcome: Cancelled}), context.Cause(ctx)
	}
	if f.running {
		return nil, h.count(Result{Outcome: InProgress, RetryAfter: f.retryAfter(h.cfg.lease)}), nil
	}
	res := f.res
	switch res.Outcome {
	case First, Duplicate:
		if fingerprintsDiffer(f.fp, fp) {
			res = Result{Outcome: KeyReuse}
		} else {
			res = Result{Outcome: Duplicate, Tier: TierLocal}
		}
	case Processed, NotRecorded:
		// the leader ran and left; its record is DONE (or as good as: a rerun repeats it)
		res = Result{Outcome: Duplicate, Tier: TierLocal}
	}
	return nil, h.count(res), f.err
}

func (h *Handler) do(ctx context.Context, key, fp string, fn func(context.Context) error) (Result, error) {
	k := keys.Normalize(key)
	lk := localKey(k, fp)
	f, res, err := h.check(ctx, k, lk, fp)
	if f == nil {
		return res, err
	}
	defer h.flights.leave(k, f)
	if !h.d.enter() {
		return h.lead(f, Result{Outcome: Cancelled}, ErrClosed)
	}
	defer h.d.running.Done()

	rk := h.keyHead + k
	token := newToken()
	ans, err := h.d.store.Claim(ctx, rk, token, fp, h.cfg.lease)
	if err != nil {
		return h.storeFailed(ctx, f, k, err, fn)
	}
	switch ans.Status {
	case StatusDuplicate:
		h.remember(lk)
		return h.lead(f, Result{Outcome: Duplicate, Tier: TierStore}, nil)
	case StatusConflict:
		h.log.Warn("dedup: key reused with another payload", "key_hash", keyHash(k))
		return h.lead(f, Result{Outcome: KeyReuse}, nil)
	case StatusInProgress:
		return h.lead(f, Result{Outcome: InProgress, RetryAfter: ans.TTL}, nil)
	}
	f.leaseEnd.Store(time.Now().Add(h.cfg.lease).UnixNano())
	f.answer(Result{}, nil, true)
	return h.runLeased(ctx, f, k, lk, rk, token, fn)
}

// lead publishes the leader's result to those waiting on f and returns it. First is
// not counted here: Mark counts it, and Handle goes on to run fn and counts that.
func (h *Handler) lead(f *flight, res Result, err error) (Result, error) {
	f.answer(res, err, false)
	if res.Outcome != First {
		h.count(res)
	}
	return res, err
}

func (h *Handler) storeFailed(ctx context.Context, f *flight, k string, err error, fn func(context.Context) error) (Result, error) {
	if ctx.Err() != nil {
		return h.lead(f, Result{Outcome: Cancelled}, errors.Join(err, context.Cause(ctx)))
	}
	if !errors.Is(err, ErrStoreUnavailable) {
		err = fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	}
	if h.cfg.storeFailure == FailOpen {
		h.log.Warn("dedup: store unavailable, running without dedup", "key_hash", keyHash(k), "err", err)
		if fn == nil { // Mark
			return h.lead(f, Result{Outcome: First, Unguarded: true}, nil)
		}
		f.answer(Result{}, nil, true) // concurrent calls for this key wait on this run
		return h.runPlain(ctx, fn, true)
	}
	h.log.Warn("dedup: store unavailable, failing closed", "key_hash", keyHash(k), "err", err)
	return h.lead(f, Result{Outcome: StoreUnavailable}, err)
}

// runLeased runs fn under the claim (token on rk), then completes or releases it.
func (h *Handler) runLeased(ctx context.Context, f *flight, k, lk, rk, token string, fn func(context.Context) error) (Result, error) {
	fctx, cancel := context.WithCancelCause(ctx)
	stopOnClose := context.AfterFunc(h.d.ctx, func() { cancel(ErrClosed) })
	stop, stopped := make(chan struct{}), make(chan struct{})
	go h.heartbeat(rk, token, f, cancel, stop, stopped)
	panicked, err := invoke(fctx, fn)
	close(stop)
	<-stopped
	stopOnClose()
	cause := context.Cause(fctx)
	cancel(nil)

	bg, done := context.WithTimeout(context.WithoutCancel(ctx), h.cfg.lease)
	defer done()
	if err != nil {
		h.release(bg, k, rk, token)
		return h.failed(k, panicked, err, cause)
	}
	return h.completed(k, lk, h.d.store.Complete(bg, rk, token, h.cfg.retention))
}

// failed classifies fn's error once its claim is released: a panic, a lost lease,
// cancellation (cause is fn's context's cause), or a plain failure.
func (h *Handler) failed(k string, panicked bool, err, cause error) (Result, error) {
	switch {
	case panicked:
		h.log.Error("dedup: handler panicked; claim released", "key_hash", keyHash(k))
		return h.count(Result{Outcome: Panicked}), err
	case errors.Is(cause, ErrLeaseLost):
		return h.count(Result{Outcome: LeaseLost}), errors.Join(ErrLeaseLost, err)
	case cause != nil:
		return h.count(Result{Outcome: Cancelled}), errors.Join(err, cause)
	}
	return h.count(Result{Outcome: Failed}), err
}

// completed turns the answer to Complete into the result of a successful fn.
func (h *Handler) completed(k, lk string, cerr error) (Result, error) {
	switch {
	case cerr == nil:
		h.remember(lk)
		return h.count(Result{Outcome: Processed}), nil
	case errors.Is(cerr, ErrLeaseLost):
		h.log.Warn("dedup: lease lost before completion; not recorded", "key_hash", keyHash(k))
		return h.count(Result{Outcome: LeaseLost}), ErrLeaseLost
	default:
		h.log.Warn("dedup: processed but DONE not written", "key_hash", keyHash(k), "err", cerr)
		return h.count(Result{Outcome: NotRecorded}), fmt.Errorf("%w: %w", ErrNotRecorded, cerr)
	}
}

// heartbeat extends the lease every lease/3 until stop is closed. It cancels fn with
// ErrLeaseLost when the store says the lease is gone, or when the store has not
// confirmed it for a whole lease.
func (h *Handler) heartbeat(rk, token string, f *flight, cancel context.CancelCauseFunc, stop <-chan struct{}, stopped chan<- struct{}) {
	defer close(stopped)
	every := h.cfg.lease / 3
	t := time.NewTicker(every)
	defer t.Stop()
	confirmed := time.Now()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		ctx, done := context.WithTimeout(context.Background(), every)
		err := h.d.store.Extend(ctx, rk, token, h.cfg.lease)
		done()
		now := time.Now()
		switch {
		case err == nil:
			confirmed = now
			f.leaseEnd.Store(now.Add(h.cfg.lease).UnixNano())
			continue
		case errors.Is(err, ErrLeaseLost):
		case now.Sub(confirmed) < h.cfg.lease:
			continue // a store hiccup; the lease still runs
		}
		h.stats.leaseLost.Add(1)
		cancel(ErrLeaseLost)
		return
	}
}

func (h *Handler) release(ctx context.Context, k, rk, token string) {
	if err := h.d.store.Release(ctx, rk, token); err != nil {
		h.log.Warn("dedup: release failed; the key stays claimed until its lease ends", "key_hash", keyHash(k), "err", err)
	}
}

func (h *Handler) mark(ctx context.Context, key, fp string) (Result, error) {
	k := keys.Normalize(key)
	lk := localKey(k, fp)
	f, res, err := h.check(ctx, k, lk, fp)
	if f == nil {
		return res, err
	}
	defer h.flights.leave(k, f)
	if !h.d.enter() {
		return h.lead(f, Result{Outcome: Cancelled}, ErrClosed)
	}
	defer h.d.running.Done()
	ans, err := h.d.store.Mark(ctx, h.keyHead+k, newToken(), fp, h.cfg.retention)
	if err != nil {
		return h.storeFailed(ctx, f, k, err, nil)
	}
	switch ans.Status {
	case StatusAcquired:
		h.remember(lk)
		return h.lead(f, Result{Outcome: First}, nil)
	case StatusConflict:
		h.log.Warn("dedup: key reused with another payload", "key_hash", keyHash(k))
		return h.lead(f, Result{Outcome: KeyReuse}, nil)
	}
	h.remember(lk)
	return h.lead(f, Result{Outcome: Duplicate, Tier: TierStore}, nil)
}

func (h *Handler) noKey(ctx context.Context, fn func(context.Context) error) (Result, error) {
	if h.cfg.missingKey == RejectMissingKey {
		return h.count(Result{Outcome: NoKey}), nil
	}
	if fn == nil {
		return h.count(Result{Outcome: First, Unguarded: true}), nil
	}
	return h.runPlain(ctx, fn, true)
}

// runPlain runs fn with no claim to keep: after a Mark, or unguarded.
func (h *Handler) runPlain(ctx context.Context, fn func(context.Context) error, unguarded bool) (Result, error) {
	if !h.d.enter() {
		return h.count(Result{Outcome: Cancelled}), ErrClosed
	}
	defer h.d.running.Done()
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer context.AfterFunc(h.d.ctx, func() { cancel(ErrClosed) })()
	panicked, err := invoke(fctx, fn)
	res := Result{Outcome: Processed, Unguarded: unguarded}
	switch {
	case panicked:
		res.Outcome = Panicked
	case err != nil && context.Cause(fctx) != nil:
		res.Outcome, err = Cancelled, errors.Join(err, context.Cause(fctx))
	case err != nil:
		res.Outcome = Failed
	}
	return h.count(res), err
}

func invoke(ctx context.Context, fn func(context.Context) error) (panicked bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			panicked, err = true, fmt.Errorf("%w: %v", ErrPanic, r)
		}
	}()
	return false, fn(ctx)
}

// keyHash names a key in log lines without revealing it.
func keyHash(k string) string {
	sum := sha256.Sum256([]byte(k))
	return hex.EncodeToString(sum[:8])
}
