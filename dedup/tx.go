package dedup

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/internal/storekit"
)

// Exactly-once effects on a SQL database (docs/design.md §9). A transactional run writes a
// marker row in the transaction its fn runs in, so that the marker and fn's writes
// commit or roll back together: the marker, not Redis, is the authority on
// "committed". Redis stays in front: the local tier and the claim answer known
// duplicates without a database round trip, and keep two consumers from running one
// key at once. The step sits around fn inside the one claim → run → complete
// lifecycle (handler.go, batch.go); "marker found" is one more answer of that step.
//
// The core imports no database driver: a Transactor does the database's part
// (package sqltx for database/sql, pgxtx for pgx).

// ErrCommitUnknown reports a COMMIT whose outcome is unknown: it may have reached the
// server (it was written, and the connection was lost before the answer), so it may
// have committed or not. The claim is kept until its lease ends; the redelivery's
// marker insert then decides (a committed run answers Duplicate from the database,
// an uncommitted one runs again). A COMMIT the driver never sent is no such case.
var ErrCommitUnknown = errors.New("dedup: commit outcome unknown")

// Marker is the row a transactional run writes in its transaction: which handler and
// which record (by digest: the key itself is never stored), with the payload
// fingerprint and the run's owner token, expiring after the retention by the
// database's clock.
type Marker struct {
	Handler     string        // the handler's name
	Digest      [32]byte      // SHA-256 of the record key (prefix:handler:key)
	Fingerprint string        // the payload fingerprint; "" without fingerprinting
	Owner       string        // the run's owner token (its claim's, when it has one)
	Retention   time.Duration // the marker expires this long after it is written
}

// MarkerState is what Transactor.Begin found where it wrote a marker.
type MarkerState struct {
	// Found: an unexpired marker was already committed there, by an earlier run; the
	// message was processed, and this run must not repeat it.
	Found bool
	// Fingerprint is the found marker's fingerprint.
	Fingerprint string
}

// Transactor runs a transactional handler's fns in transactions of one database,
// each with its run's marker. T is the transaction fn receives (*sql.Tx, pgx.Tx).
// Packages sqltx and pgxtx implement it; DoTx and RunTx use it.
type Transactor[T any] interface {
	// Begin opens a transaction and writes markers in it, with one statement: each
	// marker is inserted, or takes the place of an expired one (by the database's
	// clock); an unexpired one, committed by an earlier run, is left as it is and
	// reported Found. A marker another transaction holds uncommitted makes Begin wait
	// for that transaction to end. ctx bounds Begin's own statements; the transaction
	// outlives it (Commit or Rollback ends it). On an error no transaction is left open.
	Begin(ctx context.Context, markers []Marker) (tx T, found []MarkerState, err error)
	// Savepoint marks the point the next RollbackTo returns to: before each item's fn
	// in a batch of several.
	Savepoint(ctx context.Context, tx T) error
	// RollbackTo undoes the work of tx since its last Savepoint and deletes m's
	// marker, so that the commit leaves m's message unprocessed.
	RollbackTo(ctx context.Context, tx T, m Marker) error
	// Commit commits tx. An error wraps ErrCommitUnknown when the COMMIT may have
	// reached the server (the connection was lost after it was written);
	// otherwise, a COMMIT never sent included, an error means tx is rolled back.
	Commit(ctx context.Context, tx T) error
	// Rollback rolls tx back; it is called once for every transaction Begin opened
	// that is not committed.
	Rollback(ctx context.Context, tx T) error
}

// DoTx is Do for fn whose effects are writes to a database: fn runs inside a
// transaction t opens, with the run's marker written in it, so that the marker and
// fn's writes commit or roll back together. The local tier and the claim answer
// first, as for Do (Duplicate, InProgress, KeyReuse); then:
//
//   - t.Begin writes the marker. One already committed (the store had no DONE record:
//     a crash between COMMIT and completion, or a lost record) answers Duplicate with
//     Tier TierDatabase, and the claim is completed to repair the store. A database
//     failure answers StoreUnavailable (the error wraps ErrStoreUnavailable).
//   - fn runs under the lease heartbeat. An error or a panic rolls the transaction
//     back (the marker with it) and releases the claim: Failed or Panicked, as Do.
//   - COMMIT. A failed commit releases the claim (Failed), a COMMIT the driver never
//     sent included. A commit whose outcome is unknown (the COMMIT may have reached
//     the server) keeps it: CommitUnknown, the error wrapping ErrCommitUnknown.
//   - The claim is completed. Once committed the run is Processed, whatever the
//     store answers: the marker answers a redelivery.
//
// With WithStoreFailure(DatabaseOnly) (or FailOpen), a store failure runs the
// transaction on the marker alone. An empty key follows the missing-key policy: under
// ProcessMissingKey fn runs in a transaction with no marker (Unguarded). Effects
// outside the transaction (an HTTP call, a message) are not covered.
func DoTx[T any](ctx context.Context, h *Handler, key string, t Transactor[T], fn func(ctx context.Context, tx T) error) (Result, error) {
	if err := checkTx(ctx, h, t, fn == nil); err != nil {
		return Result{}, err
	}
	return doTx(ctx, h, key, "", t, fn)
}

func doTx[T any](ctx context.Context, h *Handler, key, fp string, t Transactor[T], fn func(context.Context, T) error) (Result, error) {
	r := &txRun[T]{t: t}
	run := func(ctx context.Context) error { return fn(ctx, txOf[T](ctx)) }
	if key == "" {
		return h.noKey(ctx, run, r)
	}
	return h.do(ctx, key, fp, run, r, nil)
}

// MaxTxBatch is the most items RunTx runs in one transaction; a longer batch
// runs as several transactions, one after the other. Each item of a transaction
// runs behind a savepoint of its own, and PostgreSQL keeps the subtransactions of
// one transaction in a per-connection cache of 64: beyond it every other session's
// snapshots slow down while the transaction is open.
const MaxTxBatch = 64

// RunTx is Run for fns that write to a database through t: the claimed items' fns run
// one after another in one transaction (at most MaxTxBatch items per transaction), each
// behind a savepoint, with their markers; a failed item is rolled back to its savepoint
// alone. An item whose marker is found answers Duplicate (TierDatabase). A failed
// COMMIT fails the items it held (claims released); an unknown one answers
// CommitUnknown (claims kept). Keyless items, and items whose claim failed under
// DatabaseOnly or FailOpen, run each in a transaction of its own. It takes OnResult;
// Parallel is an error.
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
		// one message: a single call
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

// runStep is the step of a transactional run, or of a transactional batch's claimed
// items: one transaction around their fns (a txRun); nil for a plain run.
type runStep interface {
	// begin opens the transaction with the markers (none: an unguarded run). When
	// every marker is Found, the transaction is rolled back already.
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

// txKey carries the *txRun whose transaction a transactional fn runs in: the core
// calls fn(ctx) and the caller's typed fn finds its transaction there (txOf).
type txKey struct{}

func (r *txRun[T]) with(ctx context.Context) context.Context {
	return context.WithValue(ctx, txKey{}, r)
}

// txOf returns the transaction of the run ctx belongs to.
func txOf[T any](ctx context.Context) T {
	r, _ := ctx.Value(txKey{}).(*txRun[T])
	if r == nil { // not reached: every transactional fn runs under its step's with
		var zero T
		return zero
	}
	return r.tx
}

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

func stepRollback(ctx context.Context, step runStep) {
	if step != nil {
		step.rollback(ctx)
	}
}

// freshOf is step.fresh(), or nil for a plain run.
func freshOf(step runStep) runStep {
	if step == nil {
		return nil
	}
	return step.fresh()
}

// withStep is step.with(ctx), or ctx for a plain run.
func withStep(ctx context.Context, step runStep) context.Context {
	if step == nil {
		return ctx
	}
	return step.with(ctx)
}

// marker is the marker of a run of c.
func (h *Handler) marker(c claimed) Marker {
	return Marker{Handler: h.name, Digest: RecordDigest(c.rk), Fingerprint: c.fp, Owner: c.token, Retention: h.cfg.retention}
}

// beginStep opens step's transaction with c's marker.
func (h *Handler) beginStep(ctx context.Context, step runStep, c claimed) (MarkerState, error) {
	found, err := step.begin(ctx, []Marker{h.marker(c)})
	if err != nil {
		return MarkerState{}, err
	}
	return found[0], nil
}

// stepAnswered is the result of a transactional run whose Begin answered before fn
// ran: the database failed (err; cause is fn's context's cause, if it ended), or c's
// marker was found (committed by an earlier run). hasClaim: c holds a claim in the
// store, to give back or, for a found marker, to complete (the store lost the DONE
// record, or never got it: repaired now).
func (h *Handler) stepAnswered(ctx context.Context, c claimed, found MarkerState, err, cause error, hasClaim bool) (Result, error) {
	bg, done := h.settleCtx(ctx, h.cfg.lease)
	defer done()
	switch {
	case err != nil:
		if hasClaim {
			h.release(bg, c.k, c.rk, c.token)
		}
		switch {
		case errors.Is(cause, ErrLeaseLost):
			return h.count(Result{Outcome: LeaseLost}), errors.Join(ErrLeaseLost, err)
		case cause != nil:
			return h.count(Result{Outcome: Cancelled}), errors.Join(err, cause)
		}
		h.log.Warn("dedup: database unavailable; not run", "key_hash", keyHash(c.k), "err", err)
		return h.count(Result{Outcome: StoreUnavailable}), fmt.Errorf("%w: database: %w", ErrStoreUnavailable, err)
	case storekit.FingerprintsDiffer(found.Fingerprint, c.fp):
		if hasClaim {
			h.release(bg, c.k, c.rk, c.token)
		}
		h.log.Warn("dedup: key reused with another payload", "key_hash", keyHash(c.k))
		return h.count(Result{Outcome: KeyReuse}), nil
	}
	var cerr error
	if hasClaim {
		cerr = errOf(h.store.Complete(bg, []driver.Entry{{Key: c.rk, Token: c.token, TTL: h.cfg.retention}}))
	}
	return h.repaired(c, cerr)
}

// repaired is the result of a run whose marker was found, committed by an earlier
// run, once its claim's completion has repaired the store's record (cerr is that
// completion's error, logged): Duplicate, from the database.
func (h *Handler) repaired(c claimed, cerr error) (Result, error) {
	if cerr != nil {
		h.log.Warn("dedup: committed earlier; DONE not repaired in the store", "key_hash", keyHash(c.k), "err", cerr)
	}
	h.remember(c.f, c.lk)
	return h.count(Result{Outcome: Duplicate, Tier: TierDatabase}), nil
}

// commitFailed is the result of a transactional run whose COMMIT failed. A commit
// whose outcome is unknown keeps the claim, so that no other run starts before its
// lease ends; the redelivery's marker then decides. A commit that failed for sure
// gives the claim back: the message runs again.
func (h *Handler) commitFailed(ctx context.Context, c claimed, cerr error, hasClaim bool) (Result, error) {
	if errors.Is(cerr, ErrCommitUnknown) {
		h.log.Warn("dedup: commit outcome unknown; the claim is kept until its lease ends", "key_hash", keyHash(c.k), "err", cerr)
		return h.count(Result{Outcome: CommitUnknown, RetryAfter: h.cfg.lease}), cerr
	}
	if hasClaim {
		h.release(ctx, c.k, c.rk, c.token)
	}
	return h.count(Result{Outcome: Failed}), fmt.Errorf("dedup: commit: %w", cerr)
}

// committed is the result of a transactional run whose COMMIT succeeded: Processed,
// whatever the store says to the completion (cerr, logged), since the marker answers
// a redelivery.
func (h *Handler) committed(c claimed, cerr error) (Result, error) {
	h.notCompleted(c, cerr)
	h.remember(c.f, c.lk)
	return h.count(Result{Outcome: Processed}), nil
}

// notCompleted logs the failed completion of a committed run's claim (cerr nil: none).
func (h *Handler) notCompleted(c claimed, cerr error) {
	if cerr != nil {
		h.log.Warn("dedup: committed; DONE not written in the store (the marker answers a redelivery)", "key_hash", keyHash(c.k), "err", cerr)
	}
}

// completeCommitted completes a committed run's claim in the background, coalesced
// with the handler's other completions: the run is Processed whatever the store
// answers (the marker answers a redelivery), so its caller (the ack) need not wait a
// round trip for it. Close waits for it.
// The run's flight is left when the completion has landed, so that a call for the
// key meanwhile waits for it, instead of finding the claim still IN PROGRESS.
func (h *Handler) completeCommitted(ctx context.Context, c claimed) {
	h.d.running.Add(1)
	h.completions.add(pendingFor(ctx, &c, true, &committedRun{h: h, c: c}))
}

// committedRun takes the answer to a committed run's completion (completeCommitted).
type committedRun struct {
	h *Handler
	c claimed
}

func (r *committedRun) completionAnswered(cerr error) {
	defer r.h.d.running.Done()
	r.h.notCompleted(r.c, cerr)
	r.h.flights.leave(r.c.k, r.c.f)
}

// runOnMarker runs fn in step's transaction with no claim: its marker alone guards
// it (the store is down, under DatabaseOnly), or nothing does (c.k is "": a keyless
// message under ProcessMissingKey, Unguarded). The caller has entered.
func (h *Handler) runOnMarker(ctx context.Context, c claimed, fn func(context.Context) error, step runStep) (Result, error) {
	fctx, end := h.fnContext(ctx)
	defer end()
	var found MarkerState
	var err error
	if c.k != "" {
		found, err = h.beginStep(fctx, step, c)
	} else {
		_, err = step.begin(fctx, nil)
	}
	if err != nil || found.Found {
		return h.stepAnswered(ctx, c, found, err, context.Cause(fctx), false)
	}
	returned := false
	defer func() {
		if !returned { // fn called runtime.Goexit
			step.rollback(context.WithoutCancel(ctx))
		}
	}()
	panicked, err := h.invoke(step.with(fctx), fn)
	returned = true
	bg, done := h.settleCtx(ctx, h.cfg.lease)
	defer done()
	if err != nil {
		step.rollback(bg)
		return h.failed(c.k, panicked, err, context.Cause(fctx))
	}
	if cerr := step.commit(bg); cerr != nil {
		return h.commitFailed(bg, c, cerr, false)
	}
	if c.k == "" {
		return h.count(Result{Outcome: Processed, Unguarded: true}), nil
	}
	return h.committed(c, nil)
}
