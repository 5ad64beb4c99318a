package driver

import (
	"context"
	"time"
)

// RecordState is the state of one record.
type RecordState uint8

const (
	// RecordAbsent: no record; the message key runs when it comes.
	RecordAbsent RecordState = iota
	// RecordInProgress: an owner holds a claim and is running the handler.
	RecordInProgress
	// RecordDone: processed; the key answers Duplicate until the record expires.
	RecordDone
)

var recordStateNames = [...]string{"absent", "in-progress", "done"}

// String returns "absent", "in-progress" or "done".
func (s RecordState) String() string {
	if int(s) < len(recordStateNames) {
		return recordStateNames[s]
	}
	return "invalid"
}

// Record is what a store holds under one record key.
type Record struct {
	State RecordState
	// Owner is the owner token that wrote the record; "" when absent.
	Owner string
	// Fingerprint is the payload fingerprint stored with the record; "" when none.
	Fingerprint string
	// TTL is what is left of the record's life; 0 when absent.
	TTL time.Duration
	// ReplySize is the size in bytes of the stored reply, when HasReply.
	ReplySize int
	// HasReply says the DONE record holds a stored reply (which may be empty).
	HasReply bool
	// Notified is, for Forget, how many subscribers its forget notice reached.
	Notified int
	// Err is set on an item that failed on its own.
	Err error
	// Reply is the stored reply itself. dedup uses it for former names and never
	// shows it to operators (Lookup and Forget clear it).
	Reply string `json:"-"`
}

// RecordStore is a Store whose records operators can read, delete and count
// (Handler.Lookup, Handler.Forget, Deduper.CountRecords and former names need it).
type RecordStore interface {
	// Lookup reads the records under keys in one round trip, in key order; a missing
	// one is RecordAbsent, a value dedup did not write fails its item (ErrBadRecord).
	Lookup(ctx context.Context, keys []string) ([]Record, error)
	// Forget deletes each record under keys atomically and returns what it held. It
	// leaves alone a record IN PROGRESS unless force (ErrRecordInProgress) and a value
	// dedup did not write (ErrBadRecord).
	Forget(ctx context.Context, keys []string, force bool) ([]Record, error)
	// CountRecords counts the records under prefix per handler (only handler if set).
	CountRecords(ctx context.Context, prefix, handler string) (map[string]int64, error)
}
