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
	"github.com/dedupkit/dedupkit/keys"
	"github.com/dedupkit/dedupkit/lru"
)

// Handler guards one handler's messages: each key runs successfully at most once
// inside the retention. Get one from Deduper.Register. Safe for concurrent use.
type Handler struct {
	d    *Deduper
	name string
	cfg  handlerConfig
	// store is the Deduper's store, as the handler sees it: behind formerStore when
	// it has former names (former.go)
	store driver.Store
	local *lru.Cache // DONE keys only; nil when the tier is off
	// listening says the local tier may take keys: forget notices reach it (its
	// subscription is confirmed), or it needs none (notices.go)
	listening atomic.Bool
	// replies keeps the stored replies of DONE keys, by local key, for the reply
	// forms, bounded by bytes (WithLocalReplies); nil without replies or without a
	// local tier. A reply form's local hit needs its key here: the keys-only tier
	// above cannot answer it.
	replies *lru.Bytes
	flights *flights
	// completions coalesces the completions that need not hold their caller: batch
	// items' and committed transactional runs' (completions.go)
	completions completions
	leases      leases   // the claims its runs hold, extended by one goroutine (leases.go)
	keyHead     string   // "<prefix>:<name>:", the head of every record key
	formerHeads []string // "<prefix>:<former name>:", for each former name
	log         *slog.Logger
	stats       counters
	met         *handlerMetrics // nil: metrics off (metrics.go)
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
// extends the lease every lease/3, then records DONE. fn's context is cancelled, with
// cause ErrLeaseLost, if the lease is lost, and with cause ErrClosed on Close.
//
// The Result says what happened (see Outcome). The error is nil for Processed,
// Duplicate, InProgress, NoKey and KeyReuse; for Failed it is fn's error as is; for the
// other outcomes it wraps ErrPanic, ErrStoreUnavailable, ErrNotRecorded, ErrLeaseLost,
// ErrClosed or the context's error. An empty key follows the missing-key policy.
func (h *Handler) Do(ctx context.Context, key string, fn func(context.Context) error) (Result, error) {
	if err := h.checkInput(ctx, fn == nil); err != nil {
		return Result{}, err
	}
	if err := h.noReplies(); err != nil {
		return Result{}, err
	}
	if key == "" {
		return h.noKey(ctx, fn, nil)
	}
	return h.do(ctx, key, "", fn, nil, nil)
}

// doReply is a run of one keyed item on a handler WithReplies (Run): fn's reply
// (SetReply) is stored with the DONE record, and a duplicate is answered with the
// stored one, from the local tier or the store.
func (h *Handler) doReply(ctx context.Context, key, fp string, fn func(context.Context) error) ItemResult {
	if h.replies != nil {
		// the local tier's answer, before anything is allocated for a run
		if v, ok := h.replies.Get(localKey(keys.Normalize(key), fp)); ok {
			return ItemResult{Result: h.countLocalHit(), Reply: v, HasReply: true}
		}
	}
	r := &replyRun{fn: fn}
	res, err := h.do(ctx, key, fp, r.call, nil, r)
	return h.replied(res, err, r.reply, r.has)
}

// noReplies refuses Do, Handle and Mark on a handler WithReplies: only
// Run's results carry the replies it stores.
func (h *Handler) noReplies() error {
	if h.cfg.replyLimit > 0 {
		return fmt.Errorf("%w: handler %q stores replies (WithReplies): run it with Run, whose results carry them", ErrInvalidOption, h.name)
	}
	return nil
}

// replyRun is one call of a reply form: the reply its result carries, kept here
// rather than in Result (see Result). It is fn's, from fn's return on, or, for a
// Duplicate, the stored one as the lifecycle found it (dup): a call either runs fn
// or is a duplicate, never both.
type replyRun struct {
	fn    func(context.Context) error
	reply string
	has   bool
	ran   bool // has is fn's reply, not a duplicate's

	mu       sync.Mutex // SetReply's, which goroutines fn starts may call
	returned bool       // fn has returned: SetReply is refused
}

type replyKey struct{}

// call runs fn with r in its context, for SetReply; it is the fn the lifecycle runs.
// A reply set by an fn that then fails is dropped.
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

// SetReply sets the reply of the run whose fn was given ctx, on a handler WithReplies
// (Run): it is stored with the DONE record when fn returns nil, and every duplicate
// gets it back (ItemResult.Reply). A later call replaces it; an fn that sets none
// stores DONE without a reply. Call it before fn returns (from fn, or a goroutine fn
// waits for). Otherwise, and in a transactional run (which stores no reply), it
// does nothing and returns an error wrapping ErrInvalidOption.
func SetReply(ctx context.Context, reply []byte) error {
	r, _ := ctx.Value(replyKey{}).(*replyRun)
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

// dup records what a duplicate answer says of the key's stored reply. Safe on nil
// (a call that is not a reply form).
func (r *replyRun) dup(reply string, has bool) {
	if r != nil {
		r.reply, r.has = reply, has
	}
}

// replied is a reply form's result: res with the reply it carries, and a Duplicate
// without a reply counted.
func (h *Handler) replied(res Result, err error, reply string, has bool) ItemResult {
	if res.Outcome == Duplicate && !has {
		h.stats.repliesMissing.Add(1)
	}
	if !has || (res.Outcome != Duplicate && res.Outcome != Processed && res.Outcome != NotRecorded && res.Outcome != LeaseLost) {
		return ItemResult{Result: res, Err: err}
	}
	return ItemResult{Result: res, Err: err, Reply: reply, HasReply: true}
}

// Mark is filter mode: one round trip that records key as DONE and answers First the
// first time, Duplicate afterwards (KeyReuse never, as Mark carries no payload). There
// is no lease: run the side effect after First, accepting that a crash loses it. An
// empty key answers NoKey, or First with Unguarded under ProcessMissingKey. A store
// failure answers StoreUnavailable, or First with Unguarded under FailOpen.
func (h *Handler) Mark(ctx context.Context, key string) (Result, error) {
	if err := h.checkInput(ctx, false); err != nil {
		return Result{}, err
	}
	if err := h.noReplies(); err != nil {
		return Result{}, err
	}
	if key == "" {
		return h.noKey(ctx, nil, nil)
	}
	k := keys.Normalize(key)
	lk := localKey(k, "")
	if h.localDone(lk) {
		return h.countLocalHit(), nil
	}
	if !h.d.enter() {
		return h.count(Result{Outcome: Cancelled}), ErrClosed
	}
	defer h.d.running.Done()
	res, err := h.mark(ctx, k, lk, "")
	if res.Outcome == First {
		h.count(res)
	}
	return res, err
}

// Handle reads msg's key with the handler's key strategy and guards fn by the
// handler's mode: ModeDo as Do, ModeFilter as Mark then fn on First. With
// fingerprinting on, the payload's fingerprint is stored and compared (KeyReuse).
func (h *Handler) Handle(ctx context.Context, msg keys.Message, fn func(context.Context) error) (Result, error) {
	if err := h.checkInput(ctx, fn == nil); err != nil {
		return Result{}, err
	}
	if err := h.noReplies(); err != nil {
		return Result{}, err
	}
	key, payload, err := h.readMessage(msg)
	if err != nil {
		return Result{}, err
	}
	return h.handleKey(ctx, key, payload, fn)
}

// runOne is a run of one keyed item (Run): a single call, by the handler's mode, or
// with its reply on a handler WithReplies.
func (h *Handler) runOne(ctx context.Context, it Item, fn func(context.Context) error) ItemResult {
	if h.cfg.replyLimit > 0 {
		return h.doReply(ctx, it.Key, h.fingerprint(it.Payload), fn)
	}
	res, err := h.handleKey(ctx, it.Key, it.Payload, fn)
	return ItemResult{Result: res, Err: err}
}

// handleKey guards fn for key by the handler's mode: ModeDo as Do, ModeFilter as
// Mark then fn on First; payload is fingerprinted when fingerprinting is on.
func (h *Handler) handleKey(ctx context.Context, key string, payload []byte, fn func(context.Context) error) (Result, error) {
	if key == "" {
		return h.noKey(ctx, fn, nil)
	}
	fp := h.fingerprint(payload)
	if h.cfg.mode == ModeDo {
		return h.do(ctx, key, fp, fn, nil, nil)
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
	res, err := h.mark(ctx, k, lk, fp)
	if res.Outcome != First {
		return res, err
	}
	return h.run(ctx, fn, res.Unguarded, true, nil)
}

// localReply answers a reply form (r) from the local tier: lk's stored reply, kept
// in the local tier's replies. Without it (never kept, evicted, or its record has no
// reply) the caller asks the store, which has it or says it has none.
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

// localDone reports whether the local tier holds lk (localKey) as DONE. Mark and
// a run of one ask it before enter, as Do's check does: a local answer makes no store
// call, so there is nothing for Close to wait for, and the hottest path writes nothing
// the Deduper shares (enter's lock and counter).
func (h *Handler) localDone(lk string) bool {
	return h.local != nil && h.local.Contains(lk)
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

// remember caches a DONE key, learnt by the leader of flight f. Should the key be
// forgotten while f was out (f.stale: a forget notice, or a purge, came meanwhile),
// the store's answer may predate the forget, so the entry is taken out again. The
// order matters: Add, then look at f.stale; the forgetting side marks f stale, then
// removes the key (dropLocal). Either this sees the mark, or the removal follows
// the Add.
func (h *Handler) remember(f *flight, lk string) {
	if h.local != nil && h.listening.Load() {
		h.local.Add(lk)
		h.unlessStale(f, lk)
	}
}

// rememberFor caches a DONE key for no longer than its record has left in the store
// (as remember for the rest).
func (h *Handler) rememberFor(f *flight, lk string, left time.Duration) {
	if h.local != nil && h.listening.Load() {
		h.local.AddFor(lk, left)
		h.unlessStale(f, lk)
	}
}

func (h *Handler) unlessStale(f *flight, lk string) {
	if f == nil || f.stale.Load() {
		h.local.Remove(lk)
	}
}

// rememberReply keeps the stored reply of a DONE key for the reply forms' local
// hits, for no longer than left (what its record has left; nothing when the store
// did not say), as rememberFor does for the key (with the same care for a forget
// meanwhile).
func (h *Handler) rememberReply(f *flight, lk, reply string, left time.Duration) {
	if h.replies == nil || left <= 0 || !h.listening.Load() {
		return
	}
	h.replies.AddFor(lk, reply, left)
	if f == nil || f.stale.Load() {
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

// check answers from the local tier or from a concurrent call for the same key. It
// returns the flight the caller leads when neither could answer. A waiter takes the
// leader's answer only where it is its own too; otherwise (another payload, or a
// leader cancelled by its own context) it waits for the leader to leave and asks again.
// A reply form (replies) takes a Duplicate only with what is known of its reply:
// from the local tier's replies, or from a flight that knows it (its claim's answer,
// or its run).
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
		f, lead := h.flights.join(k)
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
			if f.processed.Load() && f.fp == fp && !f.stale.Load() {
				// the run processed the key, and its completion is on its way
				return nil, h.count(f.duplicate(r)), nil
			}
			if !waitsForRunning(ctx) {
				return nil, h.count(Result{Outcome: InProgress, RetryAfter: f.retryAfter(h.cfg.lease)}), nil
			}
			// the caller asked to wait: once the run is over, the local tier or a
			// claim of our own answers. A run that outlasts what is left of its lease
			// (as this process knows it) is slow: answer InProgress then, so that
			// waiters do not hold their callers (the adapter's slots) for long.
			done, err := waitUpTo(ctx, f.left.done(), f.retryAfter(h.cfg.lease))
			if err != nil {
				return nil, h.count(Result{Outcome: Cancelled}), err
			}
			if !done {
				return nil, h.count(Result{Outcome: InProgress, RetryAfter: f.retryAfter(h.cfg.lease)}), nil
			}
			if f.processed.Load() && f.fp == fp && !f.stale.Load() {
				// the run processed the key: a duplicate, whether or not its DONE
				// record has landed yet (a committed run's completion is lazy) or the
				// local tier kept it, with the reply the run stored (or none)
				return nil, h.count(f.duplicate(r)), nil
			}
			continue
		}
		switch f.res.Outcome {
		case First, Duplicate:
			// a reply form needs the reply, which a Mark's answer, or the local
			// tier's to another call, does not bring: it asks the store itself once
			// the leader has left
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
// run by a concurrent call in this process, wait for that run to end instead of
// answering InProgress at once: then the key is DONE (Duplicate, from the local tier
// or the store) or free again (the caller claims it and runs). The wait ends with ctx,
// and after what is left of the run's lease, with InProgress. It does not reach fn's
// own context, so calls fn makes never wait (two runs could wait for each other).
// A key held by another process still answers InProgress. The NATS adapter uses it,
// since it runs several messages at once and a message's wait is cheaper than a
// redelivery.
func WaitForRunning(ctx context.Context) context.Context {
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

// do runs fn once for key (Do, a run of one in ModeDo, and the transactional runs: step
// is their transaction around fn, nil for a plain run). r is a reply form's run (fn
// is r.call), nil otherwise. Once the local tier and the in-flight table (check) have
// not answered, the key is a batch of one: it takes the batch's lifecycle (claimBatch),
// with its completion sent inline, since the caller waits for nothing else.
func (h *Handler) do(ctx context.Context, key, fp string, fn func(context.Context) error, step runStep, r *replyRun) (Result, error) {
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

// claimed names a run's key in its forms (normalized, local-tier, record), with its
// payload fingerprint, its owner token and the flight its caller leads for it. For a
// reply form it also holds fn's reply, from fn's return to the completion that
// stores it with DONE (setReply): that is where a reply lives meanwhile, on the
// single path (runLeased) and on the batch's (batchItem, then the completions).
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

// complete completes c's claim: with its reply when it has one to store.
func (h *Handler) complete(ctx context.Context, c claimed) error {
	e := driver.Entry{Key: c.rk, Token: c.token, TTL: h.cfg.retention}
	if c.storesReply() {
		e.Reply, e.HasReply = c.reply, true
	}
	return errOf(h.store.Complete(ctx, []driver.Entry{e}))
}

// answerOf is the answer to a call of one entry: the call's error, else the entry's.
func answerOf(as []driver.Answer, err error) (driver.Answer, error) {
	switch {
	case err != nil:
		return driver.Answer{}, err
	case len(as) != 1:
		return driver.Answer{}, fmt.Errorf("%w: %d answers to one entry", ErrStoreUnavailable, len(as))
	}
	return as[0], as[0].Err
}

// errOf is the error of a call of one entry: the call's, else the entry's.
func errOf(errs []error, err error) error {
	switch {
	case err != nil:
		return err
	case len(errs) != 1:
		return fmt.Errorf("%w: %d answers to one entry", ErrStoreUnavailable, len(errs))
	}
	return errs[0]
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

// releaseUnanswered gives back a claim whose reply never came (err): it may have
// landed. Release deletes only an IN PROGRESS record under this token, so it is
// always safe. It runs in the background (a down store would delay the answer); the
// caller has entered, so Close waits for it. A claim the breaker refused was never
// sent: nothing to give back.
func (h *Handler) releaseUnanswered(ctx context.Context, k, rk, token string, err error) {
	if errors.Is(err, errBreakerOpen) {
		return
	}
	h.d.running.Add(1)
	go func() {
		defer h.d.running.Done()
		bg, done := h.settleCtx(ctx, min(h.cfg.lease, releaseTimeout))
		defer done()
		h.release(bg, k, rk, token)
	}()
}

// cutShort is the error of a call whose store call ended because the caller's ctx
// did (a deadline, a shutdown) or the Deduper closed, not because the store failed:
// the outcome is then Cancelled. nil otherwise.
func cutShort(ctx context.Context, err error) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("dedup: cancelled before the store answered: %w", context.Cause(ctx))
	case errors.Is(err, ErrClosed):
		return fmt.Errorf("dedup: closed before the store answered: %w", ErrClosed)
	}
	return nil
}

// storeWarn logs a run's store failure: a warning, or, while the breaker is open (it
// warned once when it opened), a debug line, so that an outage does not log a line
// per message.
func (h *Handler) storeWarn(err error, msg string, args ...any) {
	if errors.Is(err, errBreakerOpen) {
		h.log.Debug(msg, args...)
		return
	}
	h.log.Warn(msg, args...)
}

// releaseTimeout bounds a best-effort release.
const releaseTimeout = 2 * time.Second

// markFailed is the result of a Mark the store did not answer (err), for the leader
// of flight f: Cancelled when the caller's context or Close cut it, First unguarded
// under FailOpen, StoreUnavailable otherwise.
func (h *Handler) markFailed(ctx context.Context, f *flight, k string, err error) (Result, error) {
	if cerr := cutShort(ctx, err); cerr != nil {
		return h.lead(f, Result{Outcome: Cancelled}, cerr)
	}
	if !errors.Is(err, ErrStoreUnavailable) {
		err = fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	}
	if h.cfg.storeFailure == FailOpen {
		h.met.failOpen()
		h.storeWarn(err, "dedup: store unavailable, running without dedup", "key_hash", keyHash(k), "err", err)
		return h.lead(f, Result{Outcome: First, Unguarded: true}, nil)
	}
	h.storeWarn(err, "dedup: store unavailable, failing closed", "key_hash", keyHash(k), "err", err)
	return h.lead(f, Result{Outcome: StoreUnavailable}, err)
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

// completed turns the answer to Complete into the result of a successful fn. A
// completion that wrote DONE tells the flight, and the local tier, what reply it
// stored (or none); fn's own reply goes into the result where the caller adds it
// (replied, batchOut).
func (h *Handler) completed(c claimed, cerr error) (Result, error) {
	k := c.k
	switch {
	case cerr == nil:
		h.remember(c.f, c.lk)
		if c.storesReply() {
			c.f.knowReply(c.reply, true)
			h.rememberReply(c.f, c.lk, c.reply, h.cfg.retention)
		} else {
			c.f.knowReply("", false)
		}
		if c.tooLarge {
			return h.count(Result{Outcome: Processed}), fmt.Errorf("%w: %d bytes, the handler's limit is %d", ErrReplyTooLarge, len(c.reply), h.cfg.replyLimit)
		}
		return h.count(Result{Outcome: Processed}), nil
	case errors.Is(cerr, ErrLeaseLost):
		h.met.leaseLost(opComplete)
		h.log.Warn("dedup: lease lost before completion; not recorded", "key_hash", keyHash(k))
		return h.count(Result{Outcome: LeaseLost}), ErrLeaseLost
	default:
		h.log.Warn("dedup: processed but DONE not written", "key_hash", keyHash(k), "err", cerr)
		return h.count(Result{Outcome: NotRecorded}), fmt.Errorf("%w: %w", ErrNotRecorded, cerr)
	}
}

func (h *Handler) release(ctx context.Context, k, rk, token string) {
	if err := errOf(h.store.Release(ctx, []driver.Entry{{Key: rk, Token: token}})); err != nil {
		h.log.Warn("dedup: release failed; the key stays claimed until its lease ends", "key_hash", keyHash(k), "err", err)
	}
}

// mark is Mark after the caller has entered, for k normalized and lk its localKey
// with fp.
func (h *Handler) mark(ctx context.Context, k, lk, fp string) (Result, error) {
	f, res, err := h.check(ctx, k, lk, fp, nil)
	if f == nil {
		return res, err
	}
	defer h.flights.leave(k, f)
	ans, err := answerOf(h.store.Mark(ctx, []driver.Entry{{Key: h.keyHead + k, Token: newToken(), Fingerprint: fp, TTL: h.cfg.retention}}))
	if err != nil {
		return h.markFailed(ctx, f, k, err)
	}
	return h.lead(f, h.marked(f, k, lk, ans), nil)
}

// marked turns a store's answer to Mark, for the leader of flight f, into a result,
// caching only what is DONE.
func (h *Handler) marked(f *flight, k, lk string, ans driver.Answer) Result {
	switch ans.Status {
	case driver.StatusAcquired:
		h.remember(f, lk)
		f.knowReply("", false) // the mark wrote DONE without a reply
		return Result{Outcome: First}
	case driver.StatusConflict:
		h.log.Warn("dedup: key reused with another payload", "key_hash", keyHash(k))
		return Result{Outcome: KeyReuse}
	case driver.StatusInProgress:
		// another owner is running it: a duplicate for a filter, but not DONE, so
		// not for the local tier (the owner may fail and release it)
		return Result{Outcome: Duplicate, Tier: TierStore}
	}
	// DONE by another owner, earlier: cached for no longer than the record has left,
	// and not at all when the store does not say (Mark's TTL is 0). A local entry that
	// outlived the record would answer Duplicate once the key is claimed again.
	h.rememberFor(f, lk, ans.TTL)
	return Result{Outcome: Duplicate, Tier: TierStore}
}

// noKey follows the missing-key policy for a message without a key; step is a
// transactional run's transaction (nil for a plain run), in which fn then runs with
// no marker.
func (h *Handler) noKey(ctx context.Context, fn func(context.Context) error, step runStep) (Result, error) {
	h.met.keyMissing()
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

// run runs fn with no claim to keep: after a Mark, or unguarded. The caller has
// entered. After a Mark (marked) the record is DONE already, so a cancelled fn is a
// failure, not a message to leave for redelivery: a redelivery would be a duplicate.
// An unguarded transactional run (step) runs fn in its transaction with no marker.
func (h *Handler) run(ctx context.Context, fn func(context.Context) error, unguarded, marked bool, step runStep) (Result, error) {
	if step != nil {
		return h.runOnMarker(ctx, claimed{}, fn, step)
	}
	fctx, end := h.fnContext(ctx)
	defer end()
	return h.runIn(fctx, fn, unguarded, marked)
}

// fnContext returns the context fns run in: ctx, cancelled with ErrClosed when the
// Deduper closes, and marked as not waiting for running keys (noWait). end releases
// it; the fns that ran in it are then cancelled.
func (h *Handler) fnContext(ctx context.Context) (fctx context.Context, end func()) {
	fctx, cancel := context.WithCancelCause(noWait(ctx))
	stop := context.AfterFunc(h.d.ctx, func() { cancel(ErrClosed) })
	return fctx, func() {
		stop()
		cancel(nil)
	}
}

// runIn is run in fctx, a context from fnContext: a batch runs all its marked fns in
// one, so that each costs no context of its own.
func (h *Handler) runIn(fctx context.Context, fn func(context.Context) error, unguarded, marked bool) (Result, error) {
	panicked, err := h.invoke(fctx, fn)
	res := Result{Outcome: Processed, Unguarded: unguarded}
	switch {
	case panicked:
		res.Outcome = Panicked
	case err != nil && context.Cause(fctx) != nil && !marked:
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
	return false, fn(noWait(ctx))
}

// keyHash names a key in log lines without revealing it.
func keyHash(k string) string {
	sum := sha256.Sum256([]byte(k))
	return hex.EncodeToString(sum[:8])
}
