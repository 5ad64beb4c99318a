package dedup

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/dedupkit/dedupkit/dedup/internal/batcher"
	"github.com/dedupkit/dedupkit/internal/storekit"
	"github.com/dedupkit/dedupkit/keys"
)

// Transactional runs: a marker row written in fn's own transaction makes its effects
// on a SQL database exactly once (docs/design.md §9).

// ErrCommitUnknown reports a COMMIT whose outcome is unknown: it may have reached the
// server before the connection was lost. The redelivery's marker decides.
var ErrCommitUnknown = errors.New("dedup: commit outcome unknown")

// Marker is the row a transactional run writes in its transaction. The key itself is
// never stored, only its record key's digest.
type Marker struct {
	Handler     string        // the handler's name
	Digest      [32]byte      // SHA-256 of the record key (prefix:handler:key)
	Fingerprint string        // the payload fingerprint; "" without fingerprinting
	Owner       string        // the run's owner token
	Retention   time.Duration // the marker expires this long after it is written
}

// MarkerState is what Transactor.Begin found where it wrote a marker.
type MarkerState struct {
	// Found: an unexpired marker was already committed by an earlier run.
	Found bool
	// Fingerprint is the found marker's fingerprint.
	Fingerprint string
}

// Transactor runs a transactional handler's fns in transactions of one database,
// each with its run's marker. T is the transaction fn receives (*sql.Tx, pgx.Tx).
// Packages sqltx and pgxtx implement it; DoTx and RunTx use it.
type Transactor[T any] interface {
	// Begin opens a transaction and writes markers in one statement. An expired
	// marker is replaced; an unexpired one, committed earlier, is kept and reported
	// Found; one another transaction holds uncommitted makes Begin wait. ctx bounds
	// Begin's statements only. On an error no transaction is left open.
	Begin(ctx context.Context, markers []Marker) (tx T, found []MarkerState, err error)
	// Savepoint marks where RollbackTo returns to: before each fn of a batch.
	Savepoint(ctx context.Context, tx T) error
	// RollbackTo undoes the work of tx since its last Savepoint and deletes m's
	// marker, so that the commit leaves m's message unprocessed.
	RollbackTo(ctx context.Context, tx T, m Marker) error
	// Commit commits tx. Its error wraps ErrCommitUnknown when the COMMIT may have
	// reached the server; any other error means tx is rolled back.
	Commit(ctx context.Context, tx T) error
	// Rollback rolls tx back; it is called once for each uncommitted transaction.
	Rollback(ctx context.Context, tx T) error
}

// DoTx is Do for an fn whose effects are writes to a database: fn runs in a
// transaction t opens, with the run's marker written in it, so that marker and writes
// commit or roll back together; effects outside the transaction are not covered.
// The run claims nothing in the store: past the local tier it goes straight to the
// database, where the marker's unique row makes a concurrent copy wait, and the
// store's DONE record follows the commit in the background (docs/design.md §9). So
// the store being down or silent changes nothing here, whatever the store-failure
// policy; a handler WithFormerNames excepted, which reads the former names' records
// first and fails closed when it cannot. A marker already committed answers Duplicate (TierDatabase); a database
// failure answers StoreUnavailable. An error or panic from fn rolls back. A failed
// COMMIT is Failed; one whose outcome is unknown is CommitUnknown (the error wrapping
// ErrCommitUnknown). Once committed the run is Processed. Under ProcessMissingKey a
// keyless fn runs with no marker. A nil t or fn, or a handler WithReplies, is an
// error wrapping ErrInvalidOption. See docs/transactional.md.
func DoTx[T any](ctx context.Context, h *Handler, key string, t Transactor[T], fn func(ctx context.Context, tx T) error) (Result, error) {
	if err := checkTx(ctx, h, t, fn == nil); err != nil {
		return Result{}, err
	}
	return doTx(ctx, h, key, "", t, fn)
}

func doTx[T any](ctx context.Context, h *Handler, key, fp string, t Transactor[T], fn func(context.Context, T) error) (Result, error) {
	if key != "" && h.localDone(localKey(keys.Normalize(key), fp)) { // before allocating
		return h.countLocalHit(), nil
	}
	r := &txRun[T]{t: t}
	return h.do(ctx, key, fp, func(ctx context.Context) error { return fn(ctx, txOf[T](ctx)) }, r, nil)
}

// MaxTxBatch is the most items RunTx runs in one transaction; a longer batch runs as
// several, one after the other. After a failure each item runs behind a savepoint,
// and past 64 subtransactions PostgreSQL slows down every session's snapshots.
const MaxTxBatch = 64

// RunTx is Run for fns that write to a database through t: the items' fns run in
// order in one transaction (MaxTxBatch items at most) with their markers, claiming
// nothing in the store, as DoTx. A failed item rolls it back; the others run again in
// a new one, each behind a savepoint (an fn may run twice, its transaction's effects
// once); items answer as in DoTx. Keyless items run each in a transaction of its own.
// It takes OnResult; Parallel(n > 1) is an error wrapping ErrInvalidOption.
func RunTx[T any](ctx context.Context, h *Handler, items []Item, t Transactor[T], fn func(ctx context.Context, tx T, i int) error, opts ...RunOption) []ItemResult {
	rc, err := runOptions(opts)
	if err == nil && rc.parallel != 1 {
		err = fmt.Errorf("%w: RunTx takes no Parallel: its items share one transaction", ErrInvalidOption)
	}
	if err == nil {
		err = checkTx(ctx, h, t, fn == nil)
	}
	done := rc.done
	if err != nil {
		return badBatch(items, done, err)
	}
	if len(items) == 1 && done == nil && !whenChecked(ctx) {
		res, err := doTx(ctx, h, items[0].Key, h.fingerprint(items[0].Payload), t, func(ctx context.Context, tx T) error { return fn(ctx, tx, 0) })
		return []ItemResult{{Result: res, Err: err}}
	}
	out := make([]ItemResult, 0, len(items))
	for lo := 0; lo < len(items) || lo == 0; lo += MaxTxBatch {
		hi := min(lo+MaxTxBatch, len(items))
		r := &txRun[T]{t: t}
		var chunkDone func(int, ItemResult)
		if done != nil {
			chunkDone = func(i int, res ItemResult) { done(lo+i, res) }
		}
		out = append(out, h.handleBatch(ctx, items[lo:hi], 1, func(ctx context.Context, i int) error {
			return fn(ctx, txOf[T](ctx), lo+i)
		}, chunkDone, r, nil)...)
		if hi == len(items) {
			break
		}
	}
	return out
}

// RecordDigest returns the digest a marker holds for a record key: its SHA-256.
func RecordDigest(recordKey string) [32]byte { return sha256.Sum256([]byte(recordKey)) }

// runStep is the transaction around a transactional run's fns (txRun).
type runStep interface {
	// begin opens the transaction with markers (maybe none); all Found rolls it back.
	begin(ctx context.Context, markers []Marker) ([]MarkerState, error)
	savepoint(ctx context.Context) error
	rollbackTo(ctx context.Context, m Marker) error
	commit(ctx context.Context) error
	rollback(ctx context.Context) // a no-op unless a transaction is open
	// fresh returns a step of its own, for a run outside this one's transaction.
	fresh() runStep
	// with returns ctx carrying the transaction, for the fn that runs in it.
	with(ctx context.Context) context.Context
}

// txRun is a runStep over Transactor t: the transaction its runs' fns receive.
type txRun[T any] struct {
	t    Transactor[T]
	tx   T
	open bool
}

// txKey carries the *txRun whose transaction fn receives (txOf).
type txKey struct{}

func (r *txRun[T]) with(ctx context.Context) context.Context {
	return context.WithValue(ctx, txKey{}, r)
}

// txOf returns the transaction of the run ctx belongs to: every transactional fn runs
// under its step's with.
func txOf[T any](ctx context.Context) T { return ctx.Value(txKey{}).(*txRun[T]).tx }

func (r *txRun[T]) fresh() runStep { return &txRun[T]{t: r.t} }

func (r *txRun[T]) begin(ctx context.Context, markers []Marker) ([]MarkerState, error) {
	tx, found, err := r.t.Begin(ctx, markers)
	if err != nil {
		return nil, err
	}
	r.tx, r.open = tx, true
	if len(found) != len(markers) {
		r.rollback(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("transactor answered %d markers for %d", len(found), len(markers))
	}
	all := len(markers) > 0
	for _, f := range found {
		all = all && f.Found
	}
	if all {
		r.rollback(context.WithoutCancel(ctx))
	}
	return found, nil
}

func (r *txRun[T]) savepoint(ctx context.Context) error { return r.t.Savepoint(ctx, r.tx) }

func (r *txRun[T]) rollbackTo(ctx context.Context, m Marker) error {
	return r.t.RollbackTo(ctx, r.tx, m)
}

func (r *txRun[T]) commit(ctx context.Context) error {
	r.open = false
	return r.t.Commit(ctx, r.tx)
}

func (r *txRun[T]) rollback(ctx context.Context) {
	if r.open {
		r.open = false
		_ = r.t.Rollback(ctx, r.tx) // a failed rollback ends the transaction all the same
	}
}

// freshOf is step.fresh(), or nil for a plain run.
func freshOf(step runStep) runStep {
	if step == nil {
		return nil
	}
	return step.fresh()
}

// marker is the marker of a run of c.
func (h *Handler) marker(c claimed) Marker {
	return Marker{Handler: h.name, Digest: RecordDigest(c.rk), Fingerprint: c.fp, Owner: c.token, Retention: h.cfg.retention}
}

// stepAnswered is the result of a transactional run whose Begin answered before fn
// ran: a database failure (err; cause is fn's context's cause), or a found marker.
func (h *Handler) stepAnswered(c claimed, found MarkerState, err, cause error) (Result, error) {
	switch {
	case err != nil && cause != nil:
		return h.count(Result{Outcome: Cancelled}), withCause(err, cause)
	case err != nil:
		h.log.Warn("dedup: database unavailable; not run", "key_hash", keyHash(c.k), "err", err)
		return h.count(Result{Outcome: StoreUnavailable}), fmt.Errorf("%w: database: %w", ErrStoreUnavailable, err)
	case storekit.FingerprintsDiffer(found.Fingerprint, c.fp):
		h.log.Warn("dedup: key reused with another payload", "key_hash", keyHash(c.k))
		return h.count(Result{Outcome: KeyReuse}), nil
	}
	h.remember(c.f.since, c.lk, h.cfg.retention)
	return h.count(Result{Outcome: Duplicate, Tier: TierDatabase}), nil
}

// commitFailed is the result of a failed COMMIT: CommitUnknown when it may have
// landed (the redelivery's marker decides), else Failed.
func (h *Handler) commitFailed(c claimed, cerr error) (Result, error) {
	if errors.Is(cerr, ErrCommitUnknown) {
		h.log.Warn("dedup: commit outcome unknown; the redelivery's marker decides", "key_hash", keyHash(c.k), "err", cerr)
		return h.count(Result{Outcome: CommitUnknown, RetryAfter: h.cfg.lease}), cerr
	}
	return h.count(Result{Outcome: Failed}), fmt.Errorf("dedup: commit: %w", cerr)
}

// committed is the result of a committed run: Processed.
func (h *Handler) committed(c claimed) (Result, error) {
	h.remember(c.f.since, c.lk, h.cfg.retention)
	return h.count(Result{Outcome: Processed}), nil
}

// writeDone writes the DONE record of a key whose marker is committed, in the
// background with the other completions (lazily: internal/batcher), so that the
// store knows it too; a failure changes nothing but a log line, since the marker
// answers a redelivery. Close waits for it until it gives up on the store.
func (h *Handler) writeDone(ctx context.Context, c claimed) {
	h.d.running.Add(1)
	w := &doneWrite{h: h, k: c.k}
	w.stop = context.AfterFunc(h.d.abandon, func() {
		h.log.Warn("dedup: committed; DONE not written in the store by Close (the marker answers a redelivery)", "key_hash", keyHash(c.k))
		h.d.running.Done()
	})
	h.d.g.CompleteLater(ctx, h.completion(&c), h.cfg.lease, w, true)
}

// doneWrite takes the answer to writeDone's completion.
type doneWrite struct {
	h    *Handler
	k    string
	stop func() bool
}

func (w *doneWrite) CompletionAnswered(cerr error) {
	if w.stop() { // else Close gave up on it
		w.h.d.running.Done()
	}
	if cerr != nil {
		w.h.log.Warn("dedup: committed; DONE not written in the store (the marker answers a redelivery)", "key_hash", keyHash(w.k), "err", cerr)
	}
}

// runKeyless runs a keyless fn in step's transaction, with no marker: unguarded. The
// caller has entered.
func (h *Handler) runKeyless(ctx context.Context, fn func(context.Context) error, step runStep) (Result, error) {
	fctx, end := h.fnContext(ctx)
	defer end()
	if _, err := step.begin(fctx, nil); err != nil {
		return h.stepAnswered(claimed{}, MarkerState{}, err, context.Cause(fctx))
	}
	returned := false
	defer func() {
		if !returned { // fn called runtime.Goexit
			step.rollback(context.WithoutCancel(ctx))
		}
	}()
	panicked, err := h.invoke(step.with(fctx), fn)
	returned = true
	bg, done := batcher.Settle(ctx, h.cfg.lease)
	defer done()
	if err != nil {
		step.rollback(bg)
		return h.failed("", panicked, err, context.Cause(fctx))
	}
	if cerr := step.commit(bg); cerr != nil {
		return h.commitFailed(claimed{}, cerr)
	}
	return h.count(Result{Outcome: Processed, Unguarded: true}), nil
}
