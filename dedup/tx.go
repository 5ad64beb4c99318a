package dedup

import (
	"context"
	"crypto/sha256"
	"errors"
	"time"
)

// Exactly-once effects on a SQL database (DESIGN §9). A transactional run writes a
// marker row in the transaction its fn runs in, so that the marker and fn's writes
// commit or roll back together: the marker, not Redis, is the authority on
// "committed". Redis stays in front: the local tier and the claim answer known
// duplicates without a database round trip, and keep two consumers from running one
// key at once. The step sits around fn inside the one claim → run → complete
// lifecycle (handler.go, batch.go); "marker found" is one more answer of that step.
//
// The core imports no database driver: a Transactor does the database's part
// (package sqltx for database/sql, pgxtx for pgx).

// ErrCommitUnknown reports a COMMIT whose outcome is unknown: the connection was lost
// while it was in flight, so it may have committed or not. The claim is kept until
// its lease ends; the redelivery's marker insert then decides (a committed run
// answers Duplicate from the database, an uncommitted one runs again).
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
// Packages sqltx and pgxtx implement it; DoTx, HandleTx and HandleBatchTx use it.
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
	// Commit commits tx. An error wraps ErrCommitUnknown when the commit may have
	// happened all the same (the connection was lost while it was in flight);
	// otherwise an error means tx is rolled back.
	Commit(ctx context.Context, tx T) error
	// Rollback rolls tx back; it is called once for every transaction Begin opened
	// that is not committed.
	Rollback(ctx context.Context, tx T) error
}

// RecordDigest returns the digest a marker holds for a record key: its SHA-256.
func RecordDigest(recordKey string) [32]byte { return sha256.Sum256([]byte(recordKey)) }
