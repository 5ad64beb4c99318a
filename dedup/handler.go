package dedup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/internal/batcher"
	"github.com/dedupkit/dedupkit/dedup/internal/meter"
	"github.com/dedupkit/dedupkit/internal/storekit"
	"github.com/dedupkit/dedupkit/keys"
	"github.com/dedupkit/dedupkit/lru"
)

// Handler guards one handler's messages: each key runs successfully at most once
// inside the retention. Get one from Deduper.Register. Safe for concurrent use.
type Handler struct {
	d    *Deduper
	name string
	cfg  handlerConfig
	// store is the Deduper's, behind formerStore when the handler has former names
	store driver.Store
	local *lru.Cache // DONE keys only; nil when the tier is off
	// listening: the local tier may take keys (notices reach it, or it needs none)
	listening atomic.Bool
	// replies caches stored replies for reply-form local hits; may be nil
	replies *lru.Bytes
	flights *flights
	// forgets counts the forgets dropped from the local tier: an answer learnt while
	// it changed may predate one, and is not cached (stale)
	forgets     atomic.Uint64
	leases      leases   // the claims its runs hold, extended by one goroutine (leases.go)
	keyHead     string   // "<prefix>:<name>:", the head of every record key
	formerHeads []string // "<prefix>:<former name>:", for each former name
	log         *slog.Logger
	stats       counters
	met         *meter.Handler // nil: metrics off (internal/meter)
}

// Name returns the handler's name.
func (h *Handler) Name() string {
	if h == nil {
		return ""
	}
	return h.name
}

// Retention returns how long a DONE record of this handler lives.
func (h *Handler) Retention() time.Duration {
	if h == nil {
		return 0
	}
	return h.cfg.retention
}

// Mode returns how Handle guards fn.
func (h *Handler) Mode() Mode {
	if h == nil {
		return ModeDo
	}
	return h.cfg.mode
}

// ReplyLimit returns the largest reply the handler stores (WithReplies), 0 when it
// stores none.
func (h *Handler) ReplyLimit() int {
	if h == nil {
		return 0
	}
	return h.cfg.replyLimit
}

// KeyStrategy returns the handler's key strategy, and whether it was set with
// WithKeyStrategy (adapters put their own default in place of DefaultKeyStrategy).
func (h *Handler) KeyStrategy() (s keys.Strategy, explicit bool) {
	if h == nil {
		return DefaultKeyStrategy, false
	}
	return h.cfg.strategy, h.cfg.strategySet
}

// RecordKey returns the store key that holds key's record for this handler.
func (h *Handler) RecordKey(key string) string {
	if h == nil || h.d == nil {
		return ""
	}
	return keys.RecordKey(h.d.cfg.prefix, h.name, key)
}

// Do runs fn once for key: it claims key with a lease, runs fn while a heartbeat
// extends the lease, then records DONE. fn's context is cancelled with cause
// ErrLeaseLost if the lease is lost, and ErrClosed on Close. An empty key follows the
// missing-key policy. The error is nil for Processed, Duplicate, InProgress, NoKey
// and KeyReuse, fn's own for Failed, and otherwise wraps ErrPanic,
// ErrStoreUnavailable, ErrNotRecorded, ErrLeaseLost, ErrClosed or the context's
// error; it wraps ErrInvalidOption for a nil fn or context, or on a handler
// WithReplies (use Run).
func (h *Handler) Do(ctx context.Context, key string, fn func(context.Context) error) (Result, error) {
	if err := h.checkPlain(ctx, fn == nil); err != nil {
		return Result{}, err
	}
	return h.do(ctx, key, "", fn, nil, nil)
}

// checkPlain is checkInput for Do, Handle and Mark, which a handler WithReplies refuses.
func (h *Handler) checkPlain(ctx context.Context, fnNil bool) error {
	if err := h.checkInput(ctx, fnNil); err != nil || h.cfg.replyLimit == 0 {
		return err
	}
	return fmt.Errorf("%w: handler %q stores replies (WithReplies): run it with Run, whose results carry them", ErrInvalidOption, h.name)
}

// replyRun is a reply-form call's reply: fn's, from fn's return on, or a Duplicate's
// stored one (dup); a call either runs fn or is a duplicate, never both.
type replyRun struct {
	fn    func(context.Context) error
	reply string
	has   bool
	ran   bool // has is fn's reply, not a duplicate's

	mu       sync.Mutex // SetReply's, which goroutines fn starts may call
	returned bool       // fn has returned: SetReply is refused
}

type replyKey struct{}

// call runs fn with r in ctx, for SetReply; an fn that fails drops its reply.
func (r *replyRun) call(ctx context.Context) error {
	err := r.fn(context.WithValue(ctx, replyKey{}, r))
	r.mu.Lock()
	defer r.mu.Unlock()
	r.returned = true
	if err != nil {
		r.reply, r.has = "", false
		return err
	}
	r.ran = r.has
	return nil
}

// SetReply sets the reply of the Run item whose fn was given ctx, on a handler
// WithReplies: it is stored with DONE if fn returns nil, and duplicates get it back
// (ItemResult.Reply); a later call replaces it. Outside such an fn, after it returned,
// or in a transactional run, it returns an error wrapping ErrInvalidOption.
func SetReply(ctx context.Context, reply []byte) error {
	var r *replyRun
	if ctx != nil {
		r, _ = ctx.Value(replyKey{}).(*replyRun)
	}
	if r == nil {
		return fmt.Errorf("%w: SetReply outside the fn of a Run on a handler WithReplies (DoTx and RunTx store no reply)", ErrInvalidOption)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.returned {
		return fmt.Errorf("%w: SetReply after its run's fn returned", ErrInvalidOption)
	}
	r.reply, r.has = string(reply), true
	return nil
}

// dup records a duplicate's stored reply. Safe on nil.
func (r *replyRun) dup(reply string, has bool) {
	if r != nil {
		r.reply, r.has = reply, has
	}
}

// replied adds the reply to a reply form's result; it counts a Duplicate without one.
func (h *Handler) replied(res Result, err error, reply string, has bool) ItemResult {
	if res.Outcome == Duplicate && !has {
		h.stats.repliesMissing.Add(1)
	}
	if !has || (res.Outcome != Duplicate && res.Outcome != Processed && res.Outcome != NotRecorded && res.Outcome != LeaseLost) {
		return ItemResult{Result: res, Err: err}
	}
	return ItemResult{Result: res, Err: err, Reply: reply, HasReply: true}
}

// Mark is filter mode: one round trip records a new key as DONE and answers First
// (a key that holds a record may take a second, on Redis); Duplicate afterwards.
// There is no lease: run the side effect after First, accepting that a crash loses it. An empty key answers NoKey, or First
// Unguarded under ProcessMissingKey; a store failure answers StoreUnavailable (the
// error wrapping ErrStoreUnavailable), or First Unguarded under FailOpen. A key that
// a run of this process holds answers InProgress; one another process runs,
// Duplicate. Concurrent Marks of a key go to the store, which answers one First.
func (h *Handler) Mark(ctx context.Context, key string) (Result, error) {
	if err := h.checkPlain(ctx, false); err != nil {
		return Result{}, err
	}
	return h.mark(ctx, key, "", nil)
}

// Handle reads msg's key with the handler's key strategy and guards fn by the
// handler's mode: ModeDo as Do, ModeFilter as Mark then fn on First. With
// fingerprinting on, the payload's fingerprint is stored and compared (KeyReuse).
func (h *Handler) Handle(ctx context.Context, msg keys.Message, fn func(context.Context) error) (Result, error) {
	if err := h.checkPlain(ctx, fn == nil); err != nil {
		return Result{}, err
	}
	key, payload, err := h.readMessage(msg)
	if err != nil {
		return Result{}, err
	}
	return h.handleKey(ctx, key, payload, fn)
}

// runOne is Run for one keyed item: a single call.
func (h *Handler) runOne(ctx context.Context, it Item, fn func(context.Context) error) ItemResult {
	if h.cfg.replyLimit > 0 { // fn's reply is stored with DONE; a duplicate gets it back
		r := &replyRun{fn: fn}
		res, err := h.do(ctx, it.Key, h.fingerprint(it.Payload), r.call, nil, r)
		return h.replied(res, err, r.reply, r.has)
	}
	res, err := h.handleKey(ctx, it.Key, it.Payload, fn)
	return ItemResult{Result: res, Err: err}
}

// handleKey is Handle once the key is read: ModeDo as Do, ModeFilter as Mark then fn.
func (h *Handler) handleKey(ctx context.Context, key string, payload []byte, fn func(context.Context) error) (Result, error) {
	fp := h.fingerprint(payload)
	if h.cfg.mode == ModeDo {
		return h.do(ctx, key, fp, fn, nil, nil)
	}
	return h.mark(ctx, key, fp, fn)
}

// mark is Mark, then fn (if any) on First: Handle in ModeFilter.
func (h *Handler) mark(ctx context.Context, key, fp string, fn func(context.Context) error) (Result, error) {
	if key == "" {
		return h.noKey(ctx, fn, nil)
	}
	k := keys.Normalize(key)
	lk := localKey(k, fp)
	if h.localDone(lk) {
		return h.countLocalHit(), nil
	}
	// One enter for the mark and the run: once DONE is written, Close must not stop
	// fn from running, or the message would be lost.
	if !h.d.enter() {
		return h.count(Result{Outcome: Cancelled}), ErrClosed
	}
	defer h.d.running.Done()
	since := h.forgets.Load()
	ans, err := storekit.Only(h.store.Mark(ctx, []driver.Entry{{Key: h.keyHead + k, Token: newToken(), Fingerprint: fp, TTL: h.cfg.retention}}))
	res, err := h.marked(ctx, since, k, lk, ans, err)
	if res.Outcome != First || fn == nil {
		return h.count(res), err
	}
	return h.run(ctx, fn, res.Unguarded, !res.Unguarded, nil)
}

// localReply answers a reply form from the local tier's replies, if lk is there.
func (h *Handler) localReply(lk string, r *replyRun) bool {
	if h.replies == nil {
		return false
	}
	v, ok := h.replies.Get(lk)
	if ok {
		r.dup(v, true)
	}
	return ok
}

// localDone reports whether the local tier holds lk as DONE. Callers ask it before
// enter, so that a local hit writes nothing the Deduper shares.
func (h *Handler) localDone(lk string) bool { return h.local != nil && h.local.Contains(lk) }

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

// localKey is the local tier's key: k, with fp when there is one, so that a reused
// key with another payload misses locally. '#' is in neither of Normalize's forms.
func localKey(k, fp string) string {
	if fp == "" {
		return k
	}
	return k + "#" + fp
}

// processedFor: f's run processed the key for fingerprint fp, no forget since.
func (h *Handler) processedFor(f *flight, fp string) bool {
	return f.processed.Load() && f.fp == fp && !h.stale(f.since)
}

// stale reports whether a forget reached the local tier since forget count since:
// what a call that began then learnt may predate it.
func (h *Handler) stale(since uint64) bool { return h.forgets.Load() != since }

// remember caches a DONE key learnt by a call that began at forget count since, for
// no longer than left, what its record has left (a record written now: retention).
// A forget meanwhile takes it out again. Order matters: this adds, then reads the
// count; the forgetting side counts, then drops the key.
func (h *Handler) remember(since uint64, lk string, left time.Duration) {
	if h.local != nil && h.listening.Load() {
		h.local.AddFor(lk, left)
		if h.stale(since) {
			h.local.Remove(lk)
		}
	}
}

// rememberReply caches a DONE key's stored reply for no longer than left (not at all
// when left is 0), with remember's care for a forget meanwhile.
func (h *Handler) rememberReply(since uint64, lk, reply string, left time.Duration) {
	if h.replies == nil || left <= 0 || !h.listening.Load() {
		return
	}
	h.replies.AddFor(lk, reply, left)
	if h.stale(since) {
		h.replies.Remove(lk)
	}
}

func (h *Handler) closeLocal() {
	if h.local != nil {
		h.local.Close()
	}
	if h.replies != nil {
		h.replies.Close()
	}
}

// check answers from the local tier or from a concurrent call for the same key, or
// returns the flight the caller then leads. A waiter takes the leader's answer only
// where it is its own too (same fingerprint; a reply form needs the reply);
// otherwise it waits for the leader to leave and asks again.
func (h *Handler) check(ctx context.Context, k, lk, fp string, r *replyRun) (*flight, Result, error) {
	replies := r != nil
	for {
		if replies {
			if h.localReply(lk, r) {
				return nil, h.count(Result{Outcome: Duplicate, Tier: TierLocal}), nil
			}
		} else if h.localDone(lk) {
			return nil, h.countLocalHit(), nil
		}
		f, lead := h.flights.join(k, h.forgets.Load())
		if lead {
			f.fp = fp
			// a leader that left between our look and our join made it DONE
			var ok bool
			if replies {
				if ok = h.localReply(lk, r); ok {
					f.knowReply(r.reply, true)
				}
			} else {
				ok = h.localDone(lk)
			}
			if ok {
				res := Result{Outcome: Duplicate, Tier: TierLocal}
				f.answer(res, nil, false)
				h.flights.leave(k, f)
				return nil, h.count(res), nil
			}
			return f, Result{}, nil
		}
		if err := wait(ctx, f.ready.done()); err != nil {
			return nil, h.count(Result{Outcome: Cancelled}), err
		}
		if f.running {
			if h.processedFor(f, fp) && (r == nil || f.replyKnown) {
				// the run processed the key, and its completion is on its way
				return nil, h.count(f.duplicate(r)), nil
			}
			// a processed run's answer not ours (stale, another fp): wait for it to
			// end and ask again, not InProgress for a lease
			if !waitsForRunning(ctx) && !f.processed.Load() {
				return nil, h.count(Result{Outcome: InProgress, Tier: TierLocal, RetryAfter: f.retryAfter(h.cfg.lease)}), nil
			}
			// wait up to the run's remaining lease; a slower run answers InProgress
			done, err := waitUpTo(ctx, f.left.done(), f.retryAfter(h.cfg.lease))
			if err != nil {
				return nil, h.count(Result{Outcome: Cancelled}), err
			}
			if !done {
				return nil, h.count(Result{Outcome: InProgress, Tier: TierLocal, RetryAfter: f.retryAfter(h.cfg.lease)}), nil
			}
			if h.processedFor(f, fp) && (r == nil || f.replyKnown) {
				// a duplicate, though its DONE record may not have landed yet (NotRecorded)
				return nil, h.count(f.duplicate(r)), nil
			}
			continue
		}
		switch f.res.Outcome {
		case First, Duplicate:
			// a reply form needs the reply, which a Mark or a local hit does not bring
			if f.fp == fp && (!replies || f.replyKnown) {
				return nil, h.count(f.duplicate(r)), nil
			}
		case KeyReuse:
			if f.fp == fp {
				return nil, h.count(f.res), nil
			}
		case Cancelled:
			if errors.Is(f.err, ErrClosed) {
				return nil, h.count(f.res), f.err
			}
		default: // InProgress elsewhere, StoreUnavailable: the same for every caller
			return nil, h.count(f.res), f.err
		}
		if err := wait(ctx, f.left.done()); err != nil {
			return nil, h.count(Result{Outcome: Cancelled}), err
		}
	}
}

type waitForRunningKey struct{}

// WaitForRunning returns a context under which Do and Handle, finding their key being
// run by another call in this process, wait for that run to end instead of answering
// InProgress at once; then they answer Duplicate if its fn succeeded, else claim. The
// wait ends with ctx, or with InProgress after what is left of the run's lease. fn's
// context does not carry it, so that two runs never wait for each other. A key held
// by another process still answers InProgress. A nil ctx gives nil, which the
// calls then refuse (ErrInvalidOption).
func WaitForRunning(ctx context.Context) context.Context {
	if ctx == nil {
		return nil
	}
	return context.WithValue(ctx, waitForRunningKey{}, true)
}

// noWait keeps WaitForRunning from reaching fn: a call fn makes for a key that
// another run holds must not wait for a run that may be waiting for fn's own.
func noWait(ctx context.Context) context.Context {
	if !waitsForRunning(ctx) {
		return ctx
	}
	return context.WithValue(ctx, waitForRunningKey{}, false)
}

func waitsForRunning(ctx context.Context) bool {
	w, _ := ctx.Value(waitForRunningKey{}).(bool)
	return w
}

// waitUpTo waits for ch to close, for at most d; done is false when d ran out.
func waitUpTo(ctx context.Context, ch <-chan struct{}, d time.Duration) (done bool, err error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true, nil
	case <-t.C:
		return false, nil
	case <-ctx.Done():
		return false, context.Cause(ctx)
	}
}

func wait(ctx context.Context, ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// do runs fn once for key: Do, Handle in ModeDo, and the transactional runs (step;
// nil for a plain run). r is a reply form's run (fn is r.call). An empty key follows
// the missing-key policy; past check, the key is a batch of one (claimBatch).
func (h *Handler) do(ctx context.Context, key, fp string, fn func(context.Context) error, step runStep, r *replyRun) (Result, error) {
	if key == "" {
		return h.noKey(ctx, fn, step)
	}
	k := keys.Normalize(key)
	lk := localKey(k, fp)
	f, res, err := h.check(ctx, k, lk, fp, r)
	if f == nil {
		return res, err
	}
	one := &oneRun{b: batchItem{k: k, lk: lk, fp: fp, rk: h.keyHead + k, token: newToken(), f: f}, fn: fn}
	b, out := &one.b, &one.out
	one.lead[0], one.items[0] = b, b
	*out = batchOut{r: one.r[:], lead: one.lead[:], isSet: one.isSet[:], h: h, single: true}
	defer out.leaveItem(b) // also when fn ends this goroutine (runtime.Goexit)
	if !h.d.enter() {
		h.settle(out, b, Result{Outcome: Cancelled}, ErrClosed)
		return out.r[0].Result, out.r[0].Err
	}
	defer h.d.running.Done()
	var run func(context.Context, int) error // unused: runClaimedItem runs one.fn
	if r != nil {
		out.replies = &batchReplies{fn: func(ctx context.Context, _ int) error { return r.fn(ctx) }, items: make([]replyRun, 1)}
		run = out.replies.call
		one.fn = func(ctx context.Context) error { return run(ctx, 0) }
	}
	out.one = one
	h.claimBatch(ctx, one.items[:], 1, run, out, step)
	if r != nil {
		got := &out.replies.items[0]
		r.reply, r.has, r.ran = got.reply, got.has, got.ran
	}
	return out.r[0].Result, out.r[0].Err
}

// claimed is a claim: its key's forms, fingerprint, owner token and flight, and, for
// a reply form, fn's reply until the completion stores it with DONE (setReply).
type claimed struct {
	k, lk, rk, fp, token string
	f                    *flight

	reply    string // fn's reply, when replied
	replied  bool
	tooLarge bool // reply is larger than the handler's limit: DONE is written without it
}

// setReply gives c fn's reply, to store with DONE unless it is too large.
func (h *Handler) setReply(c *claimed, reply string) {
	c.reply, c.replied = reply, true
	if len(reply) > h.cfg.replyLimit {
		c.tooLarge = true
		h.stats.repliesTooLarge.Add(1)
		h.log.Warn("dedup: reply too large to store; processed, its duplicates will get no reply",
			"key_hash", keyHash(c.k), "reply_bytes", len(reply), "limit", h.cfg.replyLimit)
	}
}

// storesReply says c's completion writes a reply with DONE.
func (c *claimed) storesReply() bool { return c.replied && !c.tooLarge }

// completion is the entry that completes c's claim: with its reply when it has one
// to store.
func (h *Handler) completion(c *claimed) driver.Entry {
	e := driver.Entry{Key: c.rk, Token: c.token, Fingerprint: c.fp, TTL: h.cfg.retention}
	if c.storesReply() {
		e.Reply, e.HasReply = c.reply, true
	}
	return e
}

// releaseUnanswered gives back, in the background, a claim whose answer never came:
// it may have landed (Release is token-checked, so always safe). The caller has
// entered, so Close waits for it. A claim the breaker refused was never sent.
func (h *Handler) releaseUnanswered(ctx context.Context, k, rk, token string, err error) {
	if errors.Is(err, batcher.ErrBreakerOpen) {
		return
	}
	h.d.running.Add(1)
	go func() {
		defer h.d.running.Done()
		bg, done := batcher.Settle(ctx, min(h.cfg.lease, batcher.ReleaseTimeout))
		defer done()
		h.release(bg, k, rk, token)
	}()
}

// cutShort returns the error of a store call cut short by ctx or Close rather than
// failed by the store (the outcome is then Cancelled); nil otherwise.
func cutShort(ctx context.Context, err error) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("dedup: cancelled before the store answered: %w", context.Cause(ctx))
	case errors.Is(err, ErrClosed):
		return fmt.Errorf("dedup: closed before the store answered: %w", ErrClosed)
	}
	return nil
}

// storeWarn logs a store failure: a warning, or a debug line while the breaker is
// open (it warned when it opened), so that an outage does not log a line per message.
func (h *Handler) storeWarn(err error, msg string, args ...any) {
	if errors.Is(err, batcher.ErrBreakerOpen) {
		h.log.Debug(msg, args...)
		return
	}
	h.log.Warn(msg, args...)
}

// failed classifies fn's error once its claim is released: a panic, a lost lease,
// cancellation (cause is fn's context's cause), or a plain failure.
func (h *Handler) failed(k string, panicked bool, err, cause error) (Result, error) {
	switch {
	case panicked:
		h.log.Error("dedup: handler panicked; its claim released or its transaction rolled back", "key_hash", keyHash(k))
		return h.count(Result{Outcome: Panicked}), err
	case errors.Is(cause, ErrLeaseLost):
		return h.count(Result{Outcome: LeaseLost}), withCause(err, ErrLeaseLost)
	case cause != nil:
		return h.count(Result{Outcome: Cancelled}), withCause(err, cause)
	}
	return h.count(Result{Outcome: Failed}), err
}

// withCause is fn's error err with cause, what ended its context, on one line; err
// alone when it already wraps cause (fn returned ctx.Err()).
func withCause(err, cause error) error {
	if errors.Is(err, cause) {
		return err
	}
	return fmt.Errorf("%w: %w", err, cause)
}

// completed turns Complete's answer into a successful fn's result. A completion that
// wrote DONE tells the flight and the local tier which reply it stored, if any.
func (h *Handler) completed(c claimed, cerr error) (Result, error) {
	k := c.k
	switch {
	case cerr == nil:
		h.remember(c.f.since, c.lk, h.cfg.retention)
		if c.storesReply() {
			c.f.knowReply(c.reply, true)
			h.rememberReply(c.f.since, c.lk, c.reply, h.cfg.retention)
		} else {
			c.f.knowReply("", false)
		}
		if c.tooLarge {
			return h.count(Result{Outcome: Processed}), fmt.Errorf("%w: %d bytes, the handler's limit is %d", ErrReplyTooLarge, len(c.reply), h.cfg.replyLimit)
		}
		return h.count(Result{Outcome: Processed}), nil
	case errors.Is(cerr, ErrLeaseLost):
		h.met.LeaseLost(meter.OpComplete)
		h.log.Warn("dedup: lease lost before completion; not recorded", "key_hash", keyHash(k))
		return h.count(Result{Outcome: LeaseLost}), ErrLeaseLost
	default:
		h.log.Warn("dedup: processed but DONE not written", "key_hash", keyHash(k), "err", cerr)
		return h.count(Result{Outcome: NotRecorded}), fmt.Errorf("%w: %w", ErrNotRecorded, cerr)
	}
}

func (h *Handler) release(ctx context.Context, k, rk, token string) {
	if err := storekit.OnlyErr(h.store.Release(ctx, []driver.Entry{{Key: rk, Token: token}})); err != nil {
		h.log.Warn("dedup: release failed; the claim, if it landed, stays until its lease ends", "key_hash", keyHash(k), "err", err)
	}
}

// marked turns a mark's answer, or its error, into a result (not counted), caching
// only what is DONE; since is the forget count when the mark was sent. A mark the
// store did not answer is Cancelled, First Unguarded under FailOpen, or
// StoreUnavailable.
func (h *Handler) marked(ctx context.Context, since uint64, k, lk string, ans driver.Answer, err error) (Result, error) {
	switch cerr := cutShort(ctx, err); {
	case err == nil: // the store's answer stands, even if ctx ended since: DONE may be written
	case cerr != nil:
		return Result{Outcome: Cancelled}, cerr
	case !errors.Is(err, ErrStoreUnavailable):
		err = fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
		fallthrough
	default:
		if h.cfg.storeFailure == FailOpen {
			h.met.FailOpen()
			h.storeWarn(err, "dedup: store unavailable, running without dedup", "key_hash", keyHash(k), "err", err)
			return Result{Outcome: First, Unguarded: true}, nil
		}
		h.storeWarn(err, "dedup: store unavailable, failing closed", "key_hash", keyHash(k), "err", err)
		return Result{Outcome: StoreUnavailable}, err
	}
	switch ans.Status {
	case driver.StatusAcquired:
		h.remember(since, lk, h.cfg.retention)
		return Result{Outcome: First}, nil
	case driver.StatusConflict:
		h.log.Warn("dedup: key reused with another payload", "key_hash", keyHash(k))
		return Result{Outcome: KeyReuse}, nil
	case driver.StatusInProgress:
		if f := h.flights.lookup(k); f != nil {
			// a run in this process holds it, and may yet fail: as Do would answer
			return Result{Outcome: InProgress, Tier: TierStore, RetryAfter: f.retryAfter(h.cfg.lease)}, nil
		}
		// another owner runs it: a Duplicate for a filter, but not DONE, so not cached
		return Result{Outcome: Duplicate, Tier: TierStore}, nil
	}
	// cached no longer than the record lives (not at all without a TTL): an entry that
	// outlived it would answer Duplicate once the key is claimed again
	h.remember(since, lk, ans.TTL)
	return Result{Outcome: Duplicate, Tier: TierStore}, nil
}

// noKey follows the missing-key policy (with step: in a transaction, no marker).
func (h *Handler) noKey(ctx context.Context, fn func(context.Context) error, step runStep) (Result, error) {
	h.met.KeyMissing()
	if h.cfg.missingKey == RejectMissingKey {
		return h.count(Result{Outcome: NoKey}), nil
	}
	if fn == nil {
		return h.count(Result{Outcome: First, Unguarded: true}), nil
	}
	if !h.d.enter() {
		return h.count(Result{Outcome: Cancelled}), ErrClosed
	}
	defer h.d.running.Done()
	return h.run(ctx, fn, true, false, step)
}

// run runs fn with no claim, after a Mark or unguarded (with step, in a transaction
// with no marker); the caller has entered. After a Mark the record is DONE, so a
// cancelled fn is Failed, not Cancelled: its redelivery would be a duplicate.
func (h *Handler) run(ctx context.Context, fn func(context.Context) error, unguarded, marked bool, step runStep) (Result, error) {
	if step != nil {
		return h.runKeyless(ctx, fn, step)
	}
	fctx, end := h.fnContext(ctx)
	defer end()
	return h.runIn(fctx, fn, unguarded, marked)
}

// fnContext returns the context fns run in: ctx, marked noWait and cancelled with
// ErrClosed when the Deduper closes. end cancels it.
func (h *Handler) fnContext(ctx context.Context) (fctx context.Context, end func()) {
	fctx, cancel := context.WithCancelCause(noWait(ctx))
	stop := context.AfterFunc(h.d.ctx, func() { cancel(ErrClosed) })
	return fctx, func() {
		stop()
		cancel(nil)
	}
}

// runIn is run in fctx from fnContext, which a batch's marked fns share.
func (h *Handler) runIn(fctx context.Context, fn func(context.Context) error, unguarded, marked bool) (Result, error) {
	panicked, err := h.invoke(fctx, fn)
	res := Result{Outcome: Processed, Unguarded: unguarded}
	switch {
	case panicked:
		res.Outcome = Panicked
	case err != nil && context.Cause(fctx) != nil && !marked:
		res.Outcome, err = Cancelled, withCause(err, context.Cause(fctx))
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
	return false, fn(noWait(ctx))
}

// keyHash names a key in log lines without revealing it.
func keyHash(k string) string { return storekit.KeyHash(k) }
