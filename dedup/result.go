package dedup

import "time"

// Outcome says what happened to one message. docs/design.md §5 maps each to a broker
// action. The zero Outcome ("invalid") answers a call refused before it started: its
// error wraps ErrInvalidOption, and nothing ran.
type Outcome uint8

const (
	// Processed: fn ran and returned nil, and the DONE record is written. Ack.
	Processed Outcome = iota + 1
	// First: Mark found no record and wrote DONE; the caller is the first to see the key.
	First
	// Duplicate: the key is DONE (Result.Tier says where that was known); fn did not run. Ack.
	Duplicate
	// InProgress: another owner holds a live lease (Result.RetryAfter is what is left of
	// it); fn did not run. Retry later (NakWithDelay).
	InProgress
	// Failed: fn returned an error (returned as Do's error); the claim was released. Retry.
	Failed
	// Panicked: fn panicked; the claim was released; Do's error wraps ErrPanic. Retry.
	Panicked
	// NoKey: the key strategy found no key and the handler rejects such messages. Reject.
	NoKey
	// KeyReuse: the key is DONE with a different payload fingerprint; fn did not run. Reject.
	KeyReuse
	// StoreUnavailable: the store failed and the handler fails closed; fn did not run.
	// Do's error wraps ErrStoreUnavailable. Retry.
	StoreUnavailable
	// NotRecorded: fn succeeded but writing DONE failed; Do's error wraps ErrNotRecorded.
	// Ack: running fn again would repeat its side effects.
	NotRecorded
	// LeaseLost: the lease was lost while fn ran (another owner may run it); the record
	// was not completed. Do's error wraps ErrLeaseLost. Neither complete nor ack.
	LeaseLost
	// Cancelled: ctx was cancelled (shutdown) before fn finished, or the Deduper was
	// closed; the claim was released. Leave the message for redelivery.
	Cancelled
	// CommitUnknown: a transactional run's fn succeeded, and its COMMIT's outcome is
	// unknown (it was written, and the connection was lost before the answer); Do's
	// error wraps ErrCommitUnknown.
	// The claim is kept until its lease ends (Result.RetryAfter); then the
	// redelivery's marker decides: Duplicate if the commit happened, a new run if not.
	// Retry after RetryAfter (NakWithDelay).
	CommitUnknown

	numOutcomes = iota + 1
)

var outcomeNames = [numOutcomes]string{
	"invalid", "processed", "first", "duplicate", "in-progress", "failed", "panicked",
	"no-key", "key-reuse", "store-unavailable", "not-recorded", "lease-lost", "cancelled",
	"commit-unknown",
}

// String returns the outcome in lower case, e.g. "store-unavailable".
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return outcomeNames[0]
}

// Tier says where a duplicate was recognised.
type Tier uint8

const (
	// TierNone: not a duplicate.
	TierNone Tier = iota
	// TierLocal: the local cache or a concurrent call in this process; no store call.
	TierLocal
	// TierStore: the store's record.
	TierStore
	// TierDatabase: a transactional run's marker, committed by an earlier run (the
	// store had no DONE record: a crash before the completion, or a record lost).
	TierDatabase
)

// String returns "none", "local", "store" or "database".
func (t Tier) String() string {
	switch t {
	case TierLocal:
		return "local"
	case TierStore:
		return "store"
	case TierDatabase:
		return "database"
	}
	return "none"
}

// Result is the outcome of one Do, Handle or Mark. It is a value: a duplicate is a
// result, not an error. (It has four fields, the most the compiler keeps in registers:
// a fifth costs the local tier's hit a third of its time. Stored replies are in
// ItemResult.)
type Result struct {
	Outcome Outcome
	// Tier is where a Duplicate was recognised; for InProgress, where the run was
	// seen: TierStore for another owner's claim (often another process), TierLocal or
	// TierNone for a run in this process.
	Tier Tier
	// RetryAfter is, for InProgress, how long the other owner's lease has left; for
	// CommitUnknown, how long the run's own claim has left.
	RetryAfter time.Duration
	// Unguarded is true when fn ran without dedup: the store failed and the handler
	// fails open, or the message had no key and the handler processes such messages.
	Unguarded bool
}
