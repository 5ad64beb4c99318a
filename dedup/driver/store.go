package driver

import (
	"context"
	"time"
)

// Status is a store's answer to a claim or a mark.
type Status uint8

const (
	// StatusAcquired: a claim holds the record IN PROGRESS (a retried claim finds its
	// own token); a mark is the first to see the key, now DONE.
	StatusAcquired Status = iota + 1
	// StatusInProgress: another owner holds a live lease (Answer.TTL is what is left
	// of it for a claim, 0 for a mark).
	StatusInProgress
	// StatusDuplicate: the key is DONE; Answer.TTL is what is left of the record.
	StatusDuplicate
	// StatusConflict: the key is DONE with a different payload fingerprint.
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

// Answer is a store's reply for one entry.
type Answer struct {
	Status Status
	// TTL is what is left of the record found: the other owner's lease
	// (StatusInProgress) or the DONE record (StatusDuplicate). Zero otherwise.
	TTL time.Duration
	// Reply is the reply stored with a DONE record, when HasReply (ReplyStore only).
	Reply    string
	HasReply bool
	// Err is set on an entry that failed on its own.
	Err error
}

// Entry is one key of a batch call.
type Entry struct {
	Key         string        // the record key, as keys.RecordKey builds it
	Token       string        // the caller's owner token
	Fingerprint string        // payload fingerprint, "" for none
	TTL         time.Duration // lease for claims, retention for marks and completions
	// Reply is, for CompleteMany on a ReplyStore, the reply to store with the DONE
	// record when HasReply is set (an empty reply is a reply).
	Reply    string
	HasReply bool
}

// Store holds dedup records. Every method is atomic on the server and follows this
// table (docs/design.md §3):
//
//	op        | absent            | IN PROGRESS, mine | IN PROGRESS, other | DONE
//	Claim     | IN PROGRESS, Acq. | Acquired          | InProgress(PTTL)   | Duplicate (Conflict if fingerprints differ)
//	Complete  | ErrLeaseLost      | DONE, PX retention| ErrLeaseLost       | nil if mine (retried), else ErrLeaseLost
//	Release   | no-op             | delete            | no-op              | no-op
//	Extend    | ErrLeaseLost      | PEXPIRE lease     | ErrLeaseLost       | ErrLeaseLost
//	Mark      | DONE, Acquired    | -                 | InProgress         | Duplicate (Conflict if fingerprints differ), Acquired if mine
//
// Tokens are 1 to 64 bytes without ':'; an empty fingerprint is not compared. Every
// record expires on the server. Errors other than ErrLeaseLost and ErrInvalidOption
// wrap ErrStoreUnavailable.
type Store interface {
	Claim(ctx context.Context, key, token, fingerprint string, lease time.Duration) (Answer, error)
	Complete(ctx context.Context, key, token string, retention time.Duration) error
	Release(ctx context.Context, key, token string) error
	Extend(ctx context.Context, key, token string, lease time.Duration) error
	Mark(ctx context.Context, key, token, fingerprint string, retention time.Duration) (Answer, error)

	// ClaimMany claims every entry; answers are in entry order.
	ClaimMany(ctx context.Context, entries []Entry) ([]Answer, error)
	// MarkMany marks every entry; answers are in entry order.
	MarkMany(ctx context.Context, entries []Entry) ([]Answer, error)
	// CompleteMany completes every entry; one error (nil, ErrLeaseLost or a store
	// error) per entry.
	CompleteMany(ctx context.Context, entries []Entry) ([]error, error)
}

// ReplyStore is a Store that keeps a reply with a DONE record (docs/design.md §10),
// so that a duplicate gets the first run's reply back. CompleteReply completes as
// Complete does, writing reply into the DONE record; CompleteMany writes each entry's
// Reply when HasReply; Claim and ClaimMany answer StatusDuplicate with the stored
// reply. Replies are opaque bytes: a store never logs them.
type ReplyStore interface {
	Store
	// CompleteReply is Complete that stores reply with the DONE record.
	CompleteReply(ctx context.Context, key, token, reply string, retention time.Duration) error
}
