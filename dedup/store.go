package dedup

import (
	"context"
	"time"
)

// Status is a store's answer to a Claim or a Mark.
type Status uint8

const (
	// StatusAcquired: for Claim, the caller now holds the IN PROGRESS record (or it
	// already did: a retried claim finds its own token). For Mark, the caller is the
	// first to see the key and the record is now DONE.
	StatusAcquired Status = iota + 1
	// StatusInProgress: another owner holds a live lease. For Claim, Answer.TTL is what
	// is left of it; Mark does not say (TTL 0), and a filter treats it as a duplicate.
	StatusInProgress
	// StatusDuplicate: the key is DONE. For Claim, Answer.TTL is what is left of the
	// record (so a local cache never outlives it).
	StatusDuplicate
	// StatusConflict: the key is DONE with a different payload fingerprint (key reuse).
	StatusConflict
)

var statusNames = [...]string{"invalid", "acquired", "in-progress", "duplicate", "conflict"}

// String returns the status in lower case, e.g. "in-progress".
func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return statusNames[0]
}

// Answer is a store's reply for one key.
type Answer struct {
	Status Status
	// TTL is, for Claim, the remaining life of the record found: the other owner's
	// lease (StatusInProgress) or the DONE record (StatusDuplicate). Zero otherwise.
	TTL time.Duration
	// Reply is, for a Claim (or a ClaimMany entry) of a ReplyStore that answers
	// StatusDuplicate, the reply stored with the DONE record, when HasReply says
	// there is one (a reply may be empty). Replies are opaque bytes, held in a
	// string: immutable, so that they can be shared without copies.
	Reply    string
	HasReply bool
	// Err is set on a batch item that failed on its own (ClaimMany, MarkMany); single
	// calls return their error instead.
	Err error
}

// Entry is one key of a batch call.
type Entry struct {
	Key         string        // the record key, as built by keys.RecordKey
	Token       string        // the caller's owner token
	Fingerprint string        // payload fingerprint, "" for none
	TTL         time.Duration // lease for ClaimMany, retention for MarkMany and CompleteMany
	// Reply is, for CompleteMany on a ReplyStore, the reply to store with the DONE
	// record when HasReply is set (an empty reply is a reply). Other calls, and
	// stores without ReplyStore, ignore it.
	Reply    string
	HasReply bool
}

// Store holds dedup records. Every method is atomic on the server and follows the
// table in docs/design.md §3:
//
//	op        | absent            | IN PROGRESS, mine | IN PROGRESS, other | DONE
//	Claim     | IN PROGRESS, Acq. | Acquired          | InProgress(PTTL)   | Duplicate (Conflict if fingerprints differ)
//	Complete  | ErrLeaseLost      | DONE, PX retention| ErrLeaseLost       | nil if mine (retried), else ErrLeaseLost
//	Release   | no-op             | delete            | no-op              | no-op
//	Extend    | ErrLeaseLost      | PEXPIRE lease     | ErrLeaseLost       | ErrLeaseLost
//	Mark      | DONE, Acquired    | -                 | InProgress         | Duplicate (Conflict if fingerprints differ), Acquired if mine
//
// Mark answers InProgress, not Duplicate, for a record IN PROGRESS: a filter drops
// the message either way, but only a DONE key may enter a local cache, since the owner
// may yet fail and release it.
//
// Tokens are 1 to 64 bytes without ':'. Fingerprints may be empty, meaning "not
// compared". Every record expires on the server; no client clock is written. Errors
// other than ErrLeaseLost and ErrInvalidOption wrap ErrStoreUnavailable.
type Store interface {
	Claim(ctx context.Context, key, token, fingerprint string, lease time.Duration) (Answer, error)
	Complete(ctx context.Context, key, token string, retention time.Duration) error
	Release(ctx context.Context, key, token string) error
	Extend(ctx context.Context, key, token string, lease time.Duration) error
	Mark(ctx context.Context, key, token, fingerprint string, retention time.Duration) (Answer, error)

	// ClaimMany claims every entry in one round trip; answers are in entry order.
	// (RedisStore on a single server takes a second round trip for the entries that
	// found a record, to read it with its TTL atomically; see RedisStore.ClaimMany.)
	ClaimMany(ctx context.Context, entries []Entry) ([]Answer, error)
	// MarkMany marks every entry in one round trip; answers are in entry order.
	MarkMany(ctx context.Context, entries []Entry) ([]Answer, error)
	// CompleteMany completes every entry in one round trip; the result holds one error
	// (nil, ErrLeaseLost or a store error) per entry.
	CompleteMany(ctx context.Context, entries []Entry) ([]error, error)
}

// ReplyStore is implemented by stores that keep a reply with a DONE record
// (docs/design.md §10), so that a duplicate gets the first run's reply back: handlers WithReplies
// need one. RedisStore and MemoryStore implement it, and so does the Deduper's
// metered wrapper (WithMeterProvider) of a store that does.
//
// It is not part of Store so that stores written against Store keep compiling; a
// store implements it only if it also keeps these promises:
//
//   - CompleteReply completes as Complete does (the same table), writing reply into
//     the DONE record; a retried CompleteReply whose first attempt landed is nil.
//   - CompleteMany writes each entry's Reply into its DONE record when HasReply.
//   - Claim and ClaimMany answer StatusDuplicate with the record's reply (Answer.Reply,
//     HasReply), and a DONE record written without one with HasReply false.
//
// Replies are opaque bytes: a store never logs them.
type ReplyStore interface {
	Store
	// CompleteReply is Complete that stores reply with the DONE record.
	CompleteReply(ctx context.Context, key, token, reply string, retention time.Duration) error
}
