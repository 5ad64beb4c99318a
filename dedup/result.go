package dedup

import "time"

// Outcome says what happened to one message; docs/guarantees.md maps each to a
// broker action. The zero Outcome ("invalid") answers a call refused before it
// started, with an error wrapping ErrInvalidOption.
type Outcome uint8

const (
	// Processed: fn ran and returned nil, and DONE is recorded. Ack.
	Processed Outcome = iota + 1
	// First: Mark found no record and wrote DONE.
	First
	// Duplicate: the key is DONE (Result.Tier says where that was known); fn did not run. Ack.
	Duplicate
	// InProgress: another owner holds a live lease; fn did not run. Retry after RetryAfter.
	InProgress
	// Failed: fn returned an error, returned as is; the claim was released. Retry.
	Failed
	// Panicked: fn panicked; the claim was released; the error wraps ErrPanic. Retry.
	Panicked
	// NoKey: the message has no key and the handler rejects such messages. Reject.
	NoKey
	// KeyReuse: the key is DONE with a different payload fingerprint; fn did not run. Reject.
	KeyReuse
	// StoreUnavailable: the store failed and the handler fails closed; fn did not run
	// (ErrStoreUnavailable). Retry.
	StoreUnavailable
	// NotRecorded: fn succeeded but writing DONE failed; the error wraps
	// ErrNotRecorded. Ack: running fn again would repeat its side effects.
	NotRecorded
	// LeaseLost: the lease was lost and fn failed for it, or its reply found another
	// owner's (ErrLeaseLost). Neither complete nor ack. A fn that succeeds is Processed.
	LeaseLost
	// Cancelled: ctx was cancelled, or the Deduper closed, before fn finished. Leave it
	// for redelivery.
	Cancelled
	// CommitUnknown: a transactional run's COMMIT has an unknown outcome
	// (ErrCommitUnknown); the claim is kept. Retry after RetryAfter: the marker decides.
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
	// TierDatabase: a transactional run's marker, with no DONE record in the store.
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

// Result is the outcome of one Do, Handle or Mark. A duplicate is a result, not an
// error.
type Result struct {
	Outcome Outcome
	// Tier is where a Duplicate was recognised; for InProgress, where the run was
	// seen (TierStore: another owner's claim, often in another process).
	Tier Tier
	// RetryAfter is what is left of the other owner's lease (InProgress) or of the
	// run's own claim (CommitUnknown).
	RetryAfter time.Duration
	// Unguarded reports that fn ran without dedup (FailOpen, or ProcessMissingKey).
	Unguarded bool
}
