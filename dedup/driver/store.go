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
	// StatusInProgress: another owner holds a live lease (Answer.TTL: 0 for a mark).
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
	// TTL is what is left of the lease or DONE record found; zero otherwise.
	TTL time.Duration
	// Reply is the stored reply a Claim's StatusDuplicate carries, when HasReply.
	Reply    string
	HasReply bool
	// Err is set on an entry that failed on its own (ErrBadRecord, a store error).
	Err error
}

// Entry is one key of a batch call.
type Entry struct {
	Key         string        // the record key, as keys.RecordKey builds it
	Token       string        // the caller's owner token
	Fingerprint string        // payload fingerprint, "" for none
	TTL         time.Duration // lease for claims, retention for marks and completions
	// Reply is what Complete stores with DONE when HasReply (an empty one counts).
	Reply    string
	HasReply bool
}

// Store holds dedup records. Every call takes a batch of entries and answers each
// entry on its own, in entry order, atomically on the server, by this table
// (docs/design.md §3):
//
//	op        | absent            | IN PROGRESS, mine | IN PROGRESS, other | DONE
//	Claim     | IN PROGRESS, Acq. | Acquired          | InProgress(PTTL)   | Duplicate (Conflict if fingerprints differ)
//	Complete  | DONE, PX retention| DONE, PX retention| DONE, PX retention | DONE, PX retention
//	+ Reply   | ErrLeaseLost      | DONE, PX retention| ErrLeaseLost       | nil if mine (retried), else ErrLeaseLost
//	Release   | no-op             | delete            | no-op              | no-op
//	Extend    | ErrLeaseLost      | PEXPIRE lease     | ErrLeaseLost       | ErrLeaseLost
//	Mark      | DONE, Acquired    | -                 | InProgress         | Duplicate (Conflict if fingerprints differ), Acquired if mine
//
// Entry.TTL is the lease for Claim and Extend, the retention for Mark and Complete.
// A Complete without a reply writes DONE under its token and fingerprint whatever
// the record holds: once fn has succeeded, DONE is true whoever holds the lease now
// (a rival that took the key over fails its next Extend, and its Release leaves
// DONE alone). A Complete with a reply (HasReply) checks the owner, so that the
// first reply wins, and stores Entry.Reply; a Claim that answers StatusDuplicate
// returns it. Tokens are 1 to 64 bytes without ':'; an empty fingerprint is not
// compared. Every record expires on the server.
//
// An entry's own failure is in Answer.Err (or its slot of the []error); the call's
// error is a failure of the whole call, with no answers. A bad entry (token, TTL)
// refuses the whole call with ErrInvalidOption and writes nothing. Errors other than
// ErrLeaseLost and ErrInvalidOption wrap ErrStoreUnavailable.
type Store interface {
	Claim(ctx context.Context, entries []Entry) ([]Answer, error)
	Mark(ctx context.Context, entries []Entry) ([]Answer, error)
	Complete(ctx context.Context, entries []Entry) ([]error, error)
	Extend(ctx context.Context, entries []Entry) ([]error, error)
	Release(ctx context.Context, entries []Entry) ([]error, error)
}
