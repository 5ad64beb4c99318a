package dedup

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/internal/batcher"
	"github.com/dedupkit/dedupkit/dedup/internal/former"
	"github.com/dedupkit/dedupkit/internal/storekit"
	"github.com/dedupkit/dedupkit/keys"
)

// Item is one message of a batch.
type Item struct {
	Key     string // "" when the message has no key: the missing-key policy applies
	Payload []byte // fingerprinted when fingerprinting is on
}

// ItemResult is the outcome of one item of a batch; Err is what Do would return.
type ItemResult struct {
	Result
	Err error
	// Reply is the item's reply on a handler WithReplies, when HasReply is set: fn's
	// own (SetReply), or, for a Duplicate, the one stored with its DONE record.
	Reply string
	// HasReply reports whether Reply holds a reply (an empty one is a reply). It is
	// false for a Duplicate whose DONE record holds none (Stats.RepliesMissing).
	HasReply bool
}

// Run guards fn for every item by the handler's mode and returns their results in
// item order. The items are checked with one store call (Claim, or Mark in
// ModeFilter); then fn(ctx, i) runs for item i, in order, or for up to n at once with
// Parallel(n). In ModeDo each success is completed as soon as its fn returns. A copy
// of an earlier item's key answers Duplicate if that item was processed, else
// InProgress; if it failed, under WaitForRunning with n > 1, the copy runs as Do after
// the batch's fns. Keyless items follow the missing-key policy; on a handler
// WithReplies, fn sets its item's reply with SetReply. A bad option or a nil fn:
// ErrInvalidOption (docs/design.md §5).
func (h *Handler) Run(ctx context.Context, items []Item, fn func(ctx context.Context, i int) error, opts ...RunOption) []ItemResult {
	rc, err := runOptions(opts)
	if err == nil {
		err = h.checkInput(ctx, fn == nil)
	}
	if err != nil {
		return badBatch(items, rc.done, err)
	}
	if len(items) == 1 && items[0].Key != "" && rc.done == nil && !whenChecked(ctx) {
		return []ItemResult{h.runOne(ctx, items[0], func(ctx context.Context) error { return fn(ctx, 0) })}
	}
	if h.cfg.replyLimit == 0 {
		return h.handleBatch(ctx, items, rc.parallel, fn, rc.done, nil, nil)
	}
	// WithReplies: the items claim whatever the mode, and store fn's reply with DONE
	rb := &batchReplies{fn: fn, items: make([]replyRun, len(items))}
	return h.handleBatch(ctx, items, rc.parallel, rb.call, rc.done, nil, rb)
}

// RunOption configures Run and RunTx.
type RunOption func(*runConfig) error

type runConfig struct {
	parallel int
	done     func(i int, r ItemResult)
}

// Parallel lets Run run fn for up to n items at once (default 1: in item order).
// n < 1, or n > 1 given to RunTx (whose items share one transaction), is an error
// wrapping ErrInvalidOption.
func Parallel(n int) RunOption {
	return func(c *runConfig) error {
		if n < 1 {
			return fmt.Errorf("%w: Parallel(%d), want at least 1", ErrInvalidOption, n)
		}
		c.parallel = n
		return nil
	}
}

// OnResult has Run and RunTx call f for each item as soon as its result is final,
// before they return; calls may be concurrent.
func OnResult(f func(i int, r ItemResult)) RunOption {
	return func(c *runConfig) error {
		c.done = f
		return nil
	}
}

// runOptions applies opts; with a bad one it still applies the others, so that
// OnResult hands out the refused items' results too. The error is the first.
func runOptions(opts []RunOption) (runConfig, error) {
	rc := runConfig{parallel: 1}
	var first error
	for _, o := range opts {
		err := fmt.Errorf("%w: nil RunOption", ErrInvalidOption)
		if o != nil {
			err = o(&rc)
		}
		if first == nil {
			first = err
		}
	}
	return rc, first
}

// batchReplies holds a reply batch's replies by item. Item i's is written by the
// goroutine that runs its fn (or finds it a duplicate) and read after that returns.
type batchReplies struct {
	fn    func(context.Context, int) error
	items []replyRun
}

// call runs item i's fn with its replyRun in ctx, for SetReply.
func (rb *batchReplies) call(ctx context.Context, i int) error { return rb.of(i).call(ctx) }

// of returns item i's replyRun, set to run item i's fn; nil without replies.
func (rb *batchReplies) of(i int) *replyRun {
	if rb == nil {
		return nil
	}
	r := &rb.items[i]
	if r.fn == nil {
		r.fn = func(ctx context.Context) error { return rb.fn(ctx, i) }
	}
	return r
}

type whenCheckedKey struct{}

// WhenChecked returns a context under which Run and RunTx call f once, as soon as the
// store has answered the batch's checks and before its fns run (whose contexts do
// not carry f): a caller can then start checking its next batch. A nil ctx gives
// nil, which Run and RunTx then refuse (ErrInvalidOption).
func WhenChecked(ctx context.Context, f func()) context.Context {
	if ctx == nil {
		return nil
	}
	return context.WithValue(ctx, whenCheckedKey{}, f)
}

// whenChecked reports whether ctx carries a WhenChecked callback.
func whenChecked(ctx context.Context) bool {
	f, _ := ctx.Value(whenCheckedKey{}).(func())
	return f != nil
}

// batchOut holds a batch's results. Until flush, set holds them back from done,
// which may be slow (an ack) and must not delay other keys' flights or the fns.
type batchOut struct {
	r    []ItemResult
	done func(i int, r ItemResult)
	// lead[i] is item i's batchItem when the batch leads its key; its flight is left
	// as soon as its result is final, not at the end of the batch.
	lead    []*batchItem
	checked func() // WhenChecked's, called at the first flush
	h       *Handler
	replies *batchReplies // a reply batch's; nil otherwise
	// single: a batch of one (Handler.do): completed inline, its fn is one.fn
	single bool
	one    *oneRun
	comp   completer   // the batch's completions (runClaimed)
	renew  atomic.Bool // a renewal failed for want of the store: the rest are not tried

	mu      sync.Mutex
	isSet   []bool
	holding bool
	held    []int
}

func newBatchOut(n int, done func(int, ItemResult), checked func()) *batchOut {
	return &batchOut{r: make([]ItemResult, n), done: done, lead: make([]*batchItem, n),
		checked: checked, isSet: make([]bool, n), holding: true}
}

func (o *batchOut) set(i int, r ItemResult) { o.setAndLeave(i, r, true) }

// setAndLeave is set, leaving the item's flight only when leave is true (else the
// caller leaves it later: a committed item's, once its completion has landed).
func (o *batchOut) setAndLeave(i int, r ItemResult, leave bool) {
	if o.replies != nil && !o.single {
		rr := &o.replies.items[i]
		reply := o.h.replied(r.Result, r.Err, rr.reply, rr.has)
		r.Reply, r.HasReply = reply.Reply, reply.HasReply
	}
	o.mu.Lock()
	o.r[i], o.isSet[i] = r, true
	b, holding := o.lead[i], o.holding
	if holding {
		o.held = append(o.held, i)
	}
	o.mu.Unlock()
	if b != nil && leave {
		o.leaveItem(b) // before done: calls waiting for the key go on at once
	}
	if !holding && o.done != nil {
		o.done(i, r)
	}
}

// leaveItem leaves b's flight once (a mark has none). It first records whether the
// run processed the key, so that the calls waiting for it answer Duplicate.
func (o *batchOut) leaveItem(b *batchItem) {
	if b.f == nil || !b.left.CompareAndSwap(false, true) {
		return
	}
	b.settleFlight(Result{Outcome: Cancelled}, ErrClosed) // no-op unless a path forgot
	o.mu.Lock()
	processed := o.isSet[b.i] && (o.r[b.i].Outcome == Processed || o.r[b.i].Outcome == NotRecorded)
	o.mu.Unlock()
	if processed {
		b.f.processed.Store(true)
	}
	o.h.flights.leave(b.k, b.f)
}

// oneRun is a batch of one (Handler.do) in one allocation.
type oneRun struct {
	b     batchItem
	out   batchOut
	fn    func(context.Context) error
	r     [1]ItemResult
	lead  [1]*batchItem
	isSet [1]bool
	items [1]*batchItem
}

// flush hands the results held back to done; from then on set hands them at once.
func (o *batchOut) flush() {
	o.mu.Lock()
	held := o.held
	o.holding, o.held = false, nil
	checked := o.checked
	o.checked = nil
	o.mu.Unlock()
	if checked != nil {
		checked()
	}
	if o.done != nil {
		for _, i := range held {
			o.done(i, o.r[i])
		}
	}
}

// sweep gives a result to the items an fn's runtime.Goexit left without one.
func (o *batchOut) sweep(h *Handler) {
	var missing []int
	o.mu.Lock()
	for i, ok := range o.isSet {
		if !ok {
			missing = append(missing, i)
		}
	}
	o.mu.Unlock()
	for _, i := range missing {
		o.set(i, ItemResult{Result: h.count(Result{Outcome: Panicked}), Err: errGoexit})
	}
	o.flush()
}

// handleBatch is Run. step is a transactional batch's transaction (RunTx), rb a
// reply batch's replies (fn is then rb.call); each is nil otherwise.
func (h *Handler) handleBatch(ctx context.Context, items []Item, parallel int, fn func(ctx context.Context, i int) error, done func(int, ItemResult), step runStep, rb *batchReplies) []ItemResult {
	checked, _ := ctx.Value(whenCheckedKey{}).(func())
	if checked != nil {
		ctx = context.WithValue(ctx, whenCheckedKey{}, nil) // not to the fns' calls
	}
	filter := h.cfg.mode == ModeFilter && step == nil && rb == nil
	joins := (h.cfg.mode == ModeDo || rb != nil) && parallel > 1 && waitsForRunning(ctx) // copies wait, as Do (again)
	out := newBatchOut(len(items), done, checked)
	out.h, out.replies = h, rb
	defer out.sweep(h) // last: also when an fn ends this goroutine (runtime.Goexit)
	var joiners sync.WaitGroup
	defer joiners.Wait() // after the leads' flights are left (the defer below)
	var leads []*batchItem
	slab := make([]batchItem, 0, len(items)) // the leads, in one allocation: never grown
	first := make(map[string]*batchItem, len(items))
	follows := make(map[int]*batchItem)
	defer func() {
		for _, b := range leads {
			out.leaveItem(b) // those a path left without a result
		}
	}()
	var keyless []int
	var token string
	for i, it := range items {
		if it.Key == "" {
			keyless = append(keyless, i)
			continue
		}
		k := keys.Normalize(it.Key)
		fp := h.fingerprint(it.Payload)
		lk := localKey(k, fp)
		if rb != nil {
			if h.localReply(lk, rb.of(i)) {
				out.set(i, ItemResult{Result: h.count(Result{Outcome: Duplicate, Tier: TierLocal})})
				continue
			}
		} else if h.localDone(lk) {
			out.set(i, ItemResult{Result: h.countLocalHit()})
			continue
		}
		if b, ok := first[k]; ok {
			follows[i] = b
			continue
		}
		if filter { // a mark needs no flight: the store answers a copy marked meanwhile
			slab = append(slab, batchItem{i: i, k: k, lk: lk, fp: fp, rk: h.keyHead + k})
			first[k] = &slab[len(slab)-1]
			leads = append(leads, &slab[len(slab)-1])
			continue
		}
		f, lead := h.flights.join(k, h.forgets.Load())
		if !lead { // another call in this process has the key: its answer decides
			joiners.Add(1)
			go func() {
				defer joiners.Done()
				if joins { // as Do: wait for the run, then answer Duplicate or claim and run
					out.set(i, h.again(ctx, i, it.Key, fp, fn, step, rb))
					return
				}
				out.set(i, h.joined(ctx, f, fp, rb.of(i)))
			}()
			continue
		}
		f.fp = fp
		// One owner token for the batch. A store takes a record found under its own
		// token as its own (a retried claim), so no key may appear twice: first sees to it.
		if token == "" {
			token = newToken()
		}
		slab = append(slab, batchItem{i: i, k: k, lk: lk, fp: fp, rk: h.keyHead + k, token: token, f: f})
		b := &slab[len(slab)-1]
		first[k] = b
		leads = append(leads, b)
		out.mu.Lock()
		out.lead[i] = b
		out.mu.Unlock()
	}
	if len(leads) > 0 {
		h.runLeads(ctx, leads, parallel, fn, out, step)
	}
	out.flush()
	for _, i := range keyless {
		res, err := h.noKey(ctx, func(c context.Context) error { return fn(c, i) }, freshOf(step))
		out.set(i, ItemResult{Result: res, Err: err})
	}
	for i, b := range follows {
		res := Result{Outcome: InProgress, Tier: TierLocal, RetryAfter: min(h.cfg.lease, time.Second)}
		switch first := out.r[b.i]; first.Outcome {
		case Processed, Duplicate, NotRecorded:
			res = Result{Outcome: Duplicate, Tier: TierLocal}
			if first.HasReply && !errors.Is(first.Err, ErrReplyTooLarge) {
				rb.of(i).dup(first.Reply, true) // the first item's, as stored
			}
			if storekit.FingerprintsDiffer(b.fp, h.fingerprint(items[i].Payload)) {
				res = Result{Outcome: KeyReuse}
			}
		case KeyReuse:
			res = Result{Outcome: KeyReuse}
		case Failed, Panicked: // the key is free again: under joins the copy runs, once the batch's have
			if joins {
				out.set(i, h.again(ctx, i, items[i].Key, h.fingerprint(items[i].Payload), fn, step, rb))
				continue
			}
		}
		out.set(i, ItemResult{Result: h.count(res)})
	}
	joiners.Wait()
	out.flush()
	return out.r
}

// again runs item i as Do would, after another run of its key (a reply batch's fn is
// rb.call, which runs the item's replyRun).
func (h *Handler) again(ctx context.Context, i int, key, fp string, fn func(context.Context, int) error, step runStep, rb *batchReplies) ItemResult {
	res, err := h.do(ctx, key, fp, func(c context.Context) error { return fn(c, i) }, freshOf(step), rb.of(i))
	return ItemResult{Result: res, Err: err}
}

// joined is the result of an item whose key another call in this process leads. A
// reply batch's item takes a Duplicate only if the flight knows the reply.
func (h *Handler) joined(ctx context.Context, f *flight, fp string, r *replyRun) ItemResult {
	if err := wait(ctx, f.ready.done()); err != nil {
		return ItemResult{Result: h.count(Result{Outcome: Cancelled}), Err: err}
	}
	if err := ctx.Err(); err != nil { // both were ready: shutting down wins
		return ItemResult{Result: h.count(Result{Outcome: Cancelled}), Err: context.Cause(ctx)}
	}
	switch {
	case f.running && h.processedFor(f, fp) && (r == nil || f.replyKnown):
		// the run processed the key, and its completion is on its way (as check)
		return ItemResult{Result: h.count(f.duplicate(r))}
	case f.running && !f.processed.Load():
		return ItemResult{Result: h.count(Result{Outcome: InProgress, Tier: TierLocal, RetryAfter: f.retryAfter(h.cfg.lease)})}
	case f.running: // processed, but not an answer of ours: its completion lands soon
	case (f.res.Outcome == First || f.res.Outcome == Duplicate || f.res.Outcome == Processed) && f.fp == fp &&
		(r == nil || f.replyKnown):
		return ItemResult{Result: h.count(f.duplicate(r))}
	case f.res.Outcome == KeyReuse && f.fp == fp,
		f.res.Outcome == StoreUnavailable, f.res.Outcome == InProgress,
		f.res.Outcome == Cancelled && errors.Is(f.err, ErrClosed):
		return ItemResult{Result: h.count(f.res), Err: f.err}
	}
	// another fingerprint, or the leader gave up: to be retried
	return ItemResult{Result: h.count(Result{Outcome: InProgress, Tier: TierLocal, RetryAfter: min(h.cfg.lease, time.Second)})}
}

func (h *Handler) runLeads(ctx context.Context, leads []*batchItem, parallel int, fn func(context.Context, int) error, out *batchOut, step runStep) {
	if !h.d.enter() {
		for _, b := range leads {
			h.settle(out, b, Result{Outcome: Cancelled}, ErrClosed)
		}
		return
	}
	defer h.d.running.Done() // deferred: fn may end its goroutine (runtime.Goexit)
	if h.cfg.mode == ModeFilter && step == nil && out.replies == nil {
		h.markBatch(ctx, leads, parallel, fn, out)
	} else {
		h.claimBatch(ctx, leads, parallel, fn, out, step)
	}
}

// batchItem is an item the batch leads, with its flight, its claim and fn's reply.
type batchItem struct {
	i                    int
	k, lk, fp, rk, token string
	f                    *flight
	answered             bool        // f has been answered
	unguarded            bool        // a mark that failed: fn runs without dedup (FailOpen)
	left                 atomic.Bool // f has been left
	lost                 atomic.Bool // the heartbeat found the lease gone, or judged it may be
	reply                string      // fn's reply, when replied (a reply batch)
	replied, tooLarge    bool
	// set while its completion is out (completer.add)
	comp      *completer
	completed bool // its completion was answered (under comp.mu)
}

func (b *batchItem) settleFlight(res Result, err error) {
	if !b.answered && b.f != nil {
		b.answered = true
		b.f.answer(res, err, false)
	}
}

// settle answers b's flight and records (and counts) its final result.
func (h *Handler) settle(out *batchOut, b *batchItem, res Result, err error) {
	b.settleFlight(res, err)
	if res.Outcome != First {
		h.count(res)
	}
	out.set(b.i, ItemResult{Result: res, Err: err})
}

// storeItemFailed is storeFailed for one item of a batch; FailOpen runs it only if
// open.
func (h *Handler) storeItemFailed(ctx context.Context, out *batchOut, b *batchItem, err error, fn func(context.Context, int) error, open bool) {
	switch cerr := cutShort(ctx, err); {
	case cerr != nil:
		h.settle(out, b, Result{Outcome: Cancelled}, cerr)
		return
	case !errors.Is(err, ErrStoreUnavailable):
		err = fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	}
	if h.cfg.storeFailure == FailOpen && open {
		h.met.FailOpen()
		h.storeWarn(err, "dedup: store unavailable, running without dedup", "key_hash", keyHash(b.k), "err", err)
		if !b.answered {
			b.answered = true
			b.f.answer(Result{}, nil, true)
		}
		res, ferr := h.run(ctx, out.oneFn(fn, b.i), true, false, nil)
		out.set(b.i, ItemResult{Result: res, Err: ferr})
		return
	}
	h.storeWarn(err, "dedup: store unavailable, failing closed", "key_hash", keyHash(b.k), "err", err)
	h.settle(out, b, Result{Outcome: StoreUnavailable}, err)
}

// markBatch marks the leads' keys in one store call, then runs fn for each First.
func (h *Handler) markBatch(ctx context.Context, leads []*batchItem, parallel int, fn func(context.Context, int) error, out *batchOut) {
	token := newToken() // one for the call: a key appears in it once
	entries := make([]driver.Entry, len(leads))
	for j, b := range leads {
		entries[j] = driver.Entry{Key: b.rk, Token: token, Fingerprint: b.fp, TTL: h.cfg.retention}
	}
	since := h.forgets.Load()
	answers, err := h.store.Mark(ctx, entries)
	runs := leads[:0:0]
	for j, b := range leads {
		var a driver.Answer
		if err == nil {
			a = answers[j]
		}
		res, rerr := h.marked(ctx, since, b.k, b.lk, a, errors.Join(err, a.Err))
		if res.Outcome != First {
			out.set(b.i, ItemResult{Result: h.count(res), Err: rerr})
			continue
		}
		b.unguarded = res.Unguarded
		runs = append(runs, b)
	}
	out.flush() // the results known so far
	if len(runs) == 0 {
		return
	}
	fctx, end := h.fnContext(ctx) // one for the batch: fns that returned stay live until it ends
	defer end()
	// runParallel even for parallel 1: if an fn calls runtime.Goexit, the items after
	// it still run on another goroutine. Their records are DONE: unrun, they are lost.
	h.runParallel(len(runs), parallel, func(k int) {
		b := runs[k]
		ran := false
		defer func() {
			if !ran { // fn called runtime.Goexit: it did not finish
				out.set(b.i, ItemResult{Result: h.count(Result{Outcome: Panicked}), Err: errGoexit})
			}
		}()
		res, ferr := h.runIn(fctx, func(c context.Context) error { return fn(c, b.i) }, b.unguarded, !b.unguarded)
		out.set(b.i, ItemResult{Result: res, Err: ferr})
		ran = true
	})
}

// spawnAfter is how long runParallel runs items on the caller's goroutine alone
// before others join it: fast fns then cost no goroutine each.
var spawnAfter = time.Millisecond // a var for tests

// runParallel calls run(k) for k in [0, n), up to parallel at once: on the caller's
// goroutine, joined after spawnAfter by up to parallel-1 others. If run ends a
// goroutine (runtime.Goexit), a new one takes the items left.
func (h *Handler) runParallel(n, parallel int, run func(k int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	work := func() {
		for {
			k := int(next.Add(1) - 1)
			if k >= n {
				return
			}
			run(k)
		}
	}
	var more func()
	more = func() { // after work, normal or not: a no-op unless items are left
		if int(next.Load()) < n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer more()
				work()
			}()
		}
	}
	spawned := make(chan struct{})
	t := time.AfterFunc(spawnAfter, func() {
		defer close(spawned)
		for range min(parallel-1, n-int(next.Load())) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer more()
				work()
			}()
		}
	})
	defer func() {
		if !t.Stop() {
			<-spawned // its goroutines are counted in wg before this returns
		} else if left := n - int(next.Load()); left > 0 {
			// the caller's goroutine ended (Goexit) before the others were due
			for range min(parallel, left) - 1 {
				more()
			}
		}
		more()
		wg.Wait()
	}()
	work()
}

// errGoexit is the error of an item whose fn called runtime.Goexit.
var errGoexit = fmt.Errorf("%w: fn called runtime.Goexit", ErrPanic)

// claimBatch claims the leads' keys in one store call and runs those acquired
// (runClaimed). A transactional batch's (step) claim nothing: each item's marker
// guards it in the database (docs/design.md §9), and only a renamed handler's
// former names are read first (former.Store.Look).
func (h *Handler) claimBatch(ctx context.Context, leads []*batchItem, parallel int, fn func(context.Context, int) error, out *batchOut, step runStep) {
	entries := make([]driver.Entry, len(leads))
	for j, b := range leads {
		entries[j] = driver.Entry{Key: b.rk, Token: b.token, Fingerprint: b.fp, TTL: h.cfg.lease}
	}
	sent := time.Now()
	var answers []driver.Answer
	var err error
	switch fs, renamed := h.store.(*former.Store); {
	case step == nil:
		answers, err = h.store.Claim(ctx, entries)
	case renamed:
		answers, err = fs.Look(ctx, entries)
	default:
		answers = make([]driver.Answer, len(leads))
		for j := range answers {
			answers[j].Status = driver.StatusAcquired
		}
	}
	var claimed []*batchItem
	// Items whose claim failed but that run anyway (FailOpen) run after the claimed
	// ones, which hold leases meanwhile (a plain batch's; a transactional one claims
	// nothing).
	var unguarded []*batchItem
	unguardedErr := make(map[*batchItem]error)
	for j, b := range leads {
		var a driver.Answer
		if err == nil {
			a = answers[j]
		}
		if aerr := errors.Join(err, a.Err); aerr != nil {
			if step != nil { // a former name unread: it may hold the key DONE
				h.storeItemFailed(ctx, out, b, aerr, fn, false)
				continue
			}
			h.releaseUnanswered(ctx, b.k, b.rk, b.token, aerr)
			if cutShort(ctx, aerr) == nil && h.cfg.storeFailure == FailOpen {
				unguarded = append(unguarded, b)
				unguardedErr[b] = aerr
				b.answered = true
				b.f.answer(Result{}, nil, true) // waiters see InProgress, as in Do
				continue
			}
			h.storeItemFailed(ctx, out, b, aerr, fn, true)
			continue
		}
		switch a.Status {
		case driver.StatusAcquired:
			b.f.leaseEnd.Store(sent.Add(h.cfg.lease).UnixNano())
			if step == nil {
				h.leases.add(b)
			}
			b.answered = true
			b.f.answer(Result{}, nil, true)
			claimed = append(claimed, b)
		case driver.StatusDuplicate:
			h.remember(b.f.since, b.lk, a.TTL)
			if a.HasReply {
				h.rememberReply(b.f.since, b.lk, a.Reply, a.TTL)
			}
			b.f.knowReply(a.Reply, a.HasReply)
			out.replies.of(b.i).dup(a.Reply, a.HasReply)
			h.settle(out, b, Result{Outcome: Duplicate, Tier: TierStore}, nil)
		case driver.StatusConflict:
			h.log.Warn("dedup: key reused with another payload", "key_hash", keyHash(b.k))
			h.settle(out, b, Result{Outcome: KeyReuse}, nil)
		default:
			h.settle(out, b, Result{Outcome: InProgress, Tier: TierStore, RetryAfter: a.TTL}, nil)
		}
	}
	if len(claimed) == 0 {
		out.flush() // the checks are in (WhenChecked), before any unguarded run below
	} else {
		h.runClaimed(ctx, claimed, parallel, fn, out, step) // does not return if a fn calls Goexit (parallel 1)
	}
	for _, b := range unguarded {
		if h.d.ctx.Err() != nil { // Close began while the claimed ones ran: leave it unrun
			h.settle(out, b, Result{Outcome: Cancelled}, ErrClosed)
			continue
		}
		h.storeItemFailed(ctx, out, b, unguardedErr[b], fn, true)
	}
}

// runClaimed runs the claimed items' fns and completes each success as soon as its
// fn returns (completer). With parallel 1 they run in order on the caller's
// goroutine, and an fn that calls runtime.Goexit ends the batch, giving back the
// claims not run yet (rolling back a transaction); otherwise they run as runParallel
// does. With step (DoTx, RunTx) they hold no claim and run in one transaction
// (beginBatch, commitBatch), with no savepoint until one fails: runClaimedItem then
// rolls it back, and the others run again in a new one, each behind a savepoint (a
// failure costs a rerun; a batch that fails none, none).
func (h *Handler) runClaimed(ctx context.Context, claimed []*batchItem, parallel int, fn func(context.Context, int) error, out *batchOut, step runStep) {
	out.flush() // every flight is answered and the lease table has the claims: now the results known so far
	c := &out.comp
	c.h, c.ctx, c.out = h, ctx, out
	defer c.wait() // also when an fn ends this goroutine
	noRenew := &out.renew
	// a batch of one's fn has a context of its own (runClaimedItem); a transaction's
	// Begin, which may wait at another's marker, ends with Close too
	fnCtx := ctx
	if !out.single || step != nil {
		var endFns func()
		fnCtx, endFns = h.fnContext(ctx)
		defer endFns()
	}
	if step != nil {
		if claimed = h.beginBatch(ctx, fnCtx, claimed, step, out); len(claimed) == 0 {
			return
		}
	}
	if parallel == 1 || len(claimed) == 1 {
		finished := 0         // claimed[:finished] are settled, held or being completed
		var held []*batchItem // succeeded in step's transaction: to commit, then complete
		defer func() {
			if finished == len(claimed) {
				return
			}
			// fn called runtime.Goexit: roll back, give back every unsettled claim
			bg, bgDone := batcher.Settle(ctx, min(h.cfg.lease, batcher.ReleaseTimeout))
			defer bgDone()
			if step != nil {
				step.rollback(bg)
			}
			for _, b := range append(held, claimed[finished:]...) {
				h.leases.forget(b)
				if step == nil {
					h.release(bg, b.k, b.rk, b.token)
				}
			}
		}()
		savepoints := false
		for finished < len(claimed) {
			b := claimed[finished]
			if savepoints {
				if err := step.savepoint(fnCtx); err != nil {
					h.unrun(b, out, fmt.Errorf("%w: database: savepoint: %w", ErrStoreUnavailable, err))
					finished++
					continue
				}
			}
			ok := h.runClaimedItem(ctx, fnCtx, noRenew, b, fn, out, step, savepoints)
			finished++
			switch {
			case !ok && step != nil && !savepoints && len(claimed) > 1:
				// b was one of several and the first to fail: the others are at least one
				claimed, finished, held, savepoints = append(held, claimed[finished:]...), 0, nil, true
				claimed = h.beginBatch(ctx, fnCtx, claimed, step, out)
			case !ok:
			case step == nil:
				c.add(b)
			default:
				held = append(held, b)
			}
		}
		if step != nil {
			h.commitBatch(ctx, held, step, out)
		}
		return
	}
	h.runParallel(len(claimed), parallel, func(k int) {
		b := claimed[k]
		ran := false
		defer func() {
			if !ran { // fn called runtime.Goexit: give the claim back
				h.leases.forget(b)
				// before the result, which lets a call waiting for the key go on
				bg, bgDone := batcher.Settle(ctx, min(h.cfg.lease, batcher.ReleaseTimeout))
				h.release(bg, b.k, b.rk, b.token)
				bgDone()
				out.set(b.i, ItemResult{Result: h.count(Result{Outcome: Panicked}), Err: errGoexit})
			}
		}()
		if h.runClaimedItem(ctx, fnCtx, noRenew, b, fn, out, nil, false) {
			c.add(b)
		}
		ran = true
	})
}

// runClaimedItem runs fn for the claimed item b in a context a lost lease cancels
// (step: b holds no claim, nor lease). It reports true when fn succeeded and b is to
// be completed or committed; otherwise b's claim is given back, its transactional
// work undone, and its result set.
func (h *Handler) runClaimedItem(ctx, fnCtx context.Context, noRenew *atomic.Bool, b *batchItem, fn func(context.Context, int) error, out *batchOut, step runStep, savepoint bool) bool {
	run := out.oneFn(fn, b.i)
	own := out.single && step == nil // fnCtx is the caller's (runClaimed): as fnContext makes the others'
	if own {
		fnCtx = noWait(fnCtx)
	}
	fctx, cancel := context.WithCancelCause(fnCtx)
	defer cancel(nil) // deferred, as the others: fn may end its goroutine (runtime.Goexit)
	if own {
		stop := context.AfterFunc(h.d.ctx, func() { cancel(ErrClosed) })
		defer stop()
	}
	// The lease may have lapsed while b waited its turn (a starved process). b has not
	// run, so a claim still under its token is renewed; otherwise it is given back.
	if step == nil && !h.leases.setRunning(b, cancel) && (!h.leases.renew(ctx, b, noRenew) || !h.leases.setRunning(b, cancel)) {
		h.leases.forget(b)
		h.undo(ctx, b, step, savepoint)
		h.releaseUnanswered(ctx, b.k, b.rk, b.token, nil) // a no-op unless the claim is still ours
		switch {
		case h.d.ctx.Err() != nil:
			h.settle(out, b, Result{Outcome: Cancelled}, ErrClosed)
		case ctx.Err() != nil:
			h.settle(out, b, Result{Outcome: Cancelled}, context.Cause(ctx))
		default:
			h.settle(out, b, Result{Outcome: LeaseLost}, ErrLeaseLost)
		}
		return false
	}
	defer h.leases.stopRunning(b)
	if h.d.ctx.Err() != nil { // fnCtx's own cancel runs on a goroutine of its own
		cancel(ErrClosed)
	}
	var panicked bool
	var ferr error
	switch {
	case fctx.Err() == nil && step != nil:
		panicked, ferr = h.invoke(step.with(fctx), run)
	case fctx.Err() == nil: // a cancelled batch leaves the remaining items unrun
		panicked, ferr = h.invoke(fctx, run)
	default:
		ferr = fctx.Err()
	}
	if ferr == nil {
		if r := out.replies.of(b.i); r != nil && r.ran {
			c := b.claimed()
			h.setReply(&c, r.reply)
			b.reply, b.replied, b.tooLarge = c.reply, c.replied, c.tooLarge
		}
		return true
	}
	cause := context.Cause(fctx)
	h.leases.forget(b)
	h.undo(ctx, b, step, savepoint)
	if step == nil {
		bg, bgDone := batcher.Settle(ctx, h.cfg.lease)
		h.release(bg, b.k, b.rk, b.token)
		bgDone()
	}
	res, err := h.failed(b.k, panicked, ferr, cause)
	out.set(b.i, ItemResult{Result: res, Err: err})
	return false
}

// oneFn is the fn to run for item i: fn's, or a batch of one's own.
func (o *batchOut) oneFn(fn func(context.Context, int) error, i int) func(context.Context) error {
	if o.single {
		return o.one.fn
	}
	return func(c context.Context) error { return fn(c, i) }
}

// undo takes b's work out of a transactional batch's transaction: back to its
// savepoint, or, without one (the only item), by rolling back. A transaction that
// cannot be brought back fails its commit, so the items it held run again.
func (h *Handler) undo(ctx context.Context, b *batchItem, step runStep, savepoint bool) {
	if step == nil {
		return
	}
	bg, done := batcher.Settle(ctx, h.cfg.lease)
	defer done()
	if !savepoint {
		step.rollback(bg)
		return
	}
	if err := step.rollbackTo(bg, h.marker(b.claimed())); err != nil {
		h.log.Warn("dedup: rollback to savepoint failed", "key_hash", keyHash(b.k), "err", err)
	}
}

// unrun settles a transactional batch's item whose savepoint failed.
func (h *Handler) unrun(b *batchItem, out *batchOut, err error) {
	h.settle(out, b, Result{Outcome: StoreUnavailable}, err)
}

func (b *batchItem) claimed() claimed {
	return claimed{k: b.k, lk: b.lk, rk: b.rk, fp: b.fp, token: b.token, f: b.f,
		reply: b.reply, replied: b.replied, tooLarge: b.tooLarge}
}

// beginBatch opens step's transaction with the items' markers and returns the items
// to run. A found marker answers Duplicate (its DONE record written: writeDone) or
// KeyReuse; a failed Begin answers every item.
func (h *Handler) beginBatch(ctx, fnCtx context.Context, claimed []*batchItem, step runStep, out *batchOut) []*batchItem {
	markers := make([]Marker, len(claimed))
	for j, b := range claimed {
		markers[j] = h.marker(b.claimed())
	}
	found, err := step.begin(fnCtx, markers)
	run := claimed[:0:0]
	for j, b := range claimed {
		if err == nil && !found[j].Found {
			run = append(run, b)
			continue
		}
		var f MarkerState
		if err == nil {
			f = found[j]
		}
		res, rerr := h.stepAnswered(b.claimed(), f, err, context.Cause(fnCtx))
		out.set(b.i, ItemResult{Result: res, Err: rerr})
		if res.Outcome == Duplicate { // the store learns it too
			h.writeDone(ctx, b.claimed())
		}
	}
	return run
}

// commitBatch commits step's transaction and settles the items it held: Processed
// when it commits, with their DONE records written in the background (writeDone);
// CommitUnknown or Failed when it did not.
func (h *Handler) commitBatch(ctx context.Context, held []*batchItem, step runStep, out *batchOut) {
	bg, done := batcher.Settle(ctx, h.cfg.lease)
	defer done()
	if len(held) == 0 {
		step.rollback(bg) // nothing to commit: every item failed, or was found
		return
	}
	cerr := step.commit(bg)
	for _, b := range held {
		if cerr != nil {
			res, err := h.commitFailed(b.claimed(), cerr)
			out.set(b.i, ItemResult{Result: res, Err: err})
			continue
		}
		res, err := h.committed(b.claimed())
		out.set(b.i, ItemResult{Result: res, Err: err}) // a copy waiting for the run is a Duplicate
		h.writeDone(ctx, b.claimed())
	}
}

// completer completes a batch's claims through the Deduper's batcher, each as
// soon as its fn returns: a crash repeats at most the items whose completion is in
// flight. An item's result, and so its ack, follows its own completion.
type completer struct {
	h   *Handler
	ctx context.Context
	out *batchOut
	wg  sync.WaitGroup // the batch's completions not yet answered

	mu   sync.Mutex
	sent []*batchItem // the items whose completion was sent (completed marks those answered)
	late bool         // wait gave up on the completions still out
}

// wait waits for the batch's completions: up to the caller's deadline plus
// batcher.SettleGrace when it has one, as a single call's completion is waited for
// (settleCtx). An item whose completion is still out then is NotRecorded; its
// completion lands later and changes nothing the caller has.
func (c *completer) wait() {
	c.mu.Lock()
	none := len(c.sent) == 0
	c.mu.Unlock()
	dl, ok := c.ctx.Deadline()
	if none || !ok {
		c.wg.Wait()
		return
	}
	done := make(chan struct{})
	go func() {
		c.wg.Wait()
		close(done)
	}()
	t := time.NewTimer(time.Until(dl) + batcher.SettleGrace)
	defer t.Stop()
	select {
	case <-done:
		return
	case <-t.C:
	}
	var late []*batchItem
	c.mu.Lock()
	c.late = true
	for _, b := range c.sent {
		if !b.completed {
			late = append(late, b)
		}
	}
	c.mu.Unlock()
	cerr := fmt.Errorf("no answer by the caller's deadline: %w", context.DeadlineExceeded)
	for _, b := range late {
		c.h.log.Warn("dedup: processed; DONE not written by the caller's deadline", "key_hash", keyHash(b.k))
		c.out.set(b.i, ItemResult{Result: c.h.count(Result{Outcome: NotRecorded}), Err: fmt.Errorf("%w: %w", ErrNotRecorded, cerr)})
	}
}

// add sends the completion of b, whose fn succeeded. b leaves the lease table first:
// its claim stays valid for a lease after its last extension, long enough to complete.
func (c *completer) add(b *batchItem) {
	c.h.leases.forget(b)
	c.wg.Add(1)
	b.comp = c
	c.mu.Lock()
	c.sent = append(c.sent, b)
	c.mu.Unlock()
	cl := b.claimed()
	c.h.d.g.CompleteLater(c.ctx, c.h.completion(&cl), c.h.cfg.lease, b, false)
}

// CompletionAnswered takes the store's answer to b's completion (completer.add).
func (b *batchItem) CompletionAnswered(cerr error) {
	c := b.comp
	defer c.wg.Done()
	c.mu.Lock()
	b.completed = true
	late := c.late
	c.mu.Unlock()
	if late { // wait answered NotRecorded meanwhile
		c.out.leaveItem(b)
		return
	}
	res, err := c.h.completed(b.claimed(), cerr)
	b.f.processed.Store(res.Outcome == Processed || res.Outcome == NotRecorded) // fn succeeded
	c.out.set(b.i, ItemResult{Result: res, Err: err})
}
