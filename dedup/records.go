package dedup

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// RecordState is the state of one record, as Lookup and Forget report it.
type RecordState uint8

const (
	// RecordAbsent: no record; the message key runs when it comes.
	RecordAbsent RecordState = iota
	// RecordInProgress: an owner holds a claim (its lease) and is running the handler.
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
	// Owner is the owner token of the claim or mark that wrote the record; "" when
	// absent.
	Owner string
	// Fingerprint is the payload fingerprint stored with the record; "" when none.
	Fingerprint string
	// TTL is what is left of the record's life (the lease, or the retention); 0 when
	// absent.
	TTL time.Duration
	// ReplySize is the size in bytes of the reply stored with a DONE record (see
	// WithReplies), when HasReply says there is one; 0 otherwise.
	ReplySize int
	// HasReply says the DONE record holds a stored reply (which may be empty).
	HasReply bool
	// Notified is, for Forget, how many subscribers its forget notice reached: the
	// Dedupers that run the record's handler with a local tier (on a Redis Cluster,
	// only those connected to the node that holds the record). 0 for Lookup.
	Notified int
	// Err is set on an item of a batch call that failed on its own.
	Err error

	// reply is the stored reply itself, for former names (formerStore answers a
	// duplicate under a former name with it, and copies it forward). Never exported:
	// operators see its size, not its bytes. A string, so that Record stays
	// comparable.
	reply string
}

// recordOf reads a record's stored value and remaining life.
func recordOf(v string, ttl time.Duration) (Record, error) {
	rec, ok := parseRecord(v)
	if !ok {
		return Record{}, ErrBadRecord
	}
	r := Record{State: RecordDone, Owner: rec.token, Fingerprint: rec.fp, TTL: max(ttl, 0)}
	if rec.state == stateInProgress {
		r.State = RecordInProgress
	}
	if rec.hasReply {
		r.ReplySize, r.HasReply, r.reply = len(rec.reply), true, rec.reply
	}
	return r, nil
}

// RecordStore is implemented by stores whose records operators can read, delete and
// count: Handler.Lookup, Handler.Forget and Deduper.CountRecords need it, and so do
// former names (WithFormerNames). RedisStore and MemoryStore implement it, and so
// does the Deduper's metered wrapper (WithMeterProvider) of a store that does.
//
// It is not part of Store so that stores written against Store keep compiling: a
// Deduper checks for it with a type assertion, and without it Lookup, Forget and
// CountRecords return an error wrapping errors.ErrUnsupported and Register refuses
// WithFormerNames. A wrapper that embeds the Store interface hides it.
//
// Forget must delete each record atomically on the server and leave a record IN
// PROGRESS alone unless force. RedisStore and MemoryStore also send a forget notice
// for each record they delete (RedisStore from the script that deletes it), which
// every Deduper that runs the record's handler on the same store hears and drops the
// key from its local tier. That transport is unexported: with a custom store,
// Handler.Forget reaches only the caller's local tier.
type RecordStore interface {
	// Lookup reads the records under keys (record keys, as keys.RecordKey builds
	// them) in one round trip, and returns them in key order; a missing record is
	// RecordAbsent. A value dedup did not write is the item's Err (ErrBadRecord).
	Lookup(ctx context.Context, keys []string) ([]Record, error)
	// Forget deletes the records under keys in one round trip, each on its own and
	// atomically, and returns what each held. A record IN PROGRESS is left alone,
	// its item's Err wrapping ErrRecordInProgress, unless force; a value dedup did
	// not write is left alone too (ErrBadRecord). Forgetting an absent record is not
	// an error: local tiers are told all the same.
	Forget(ctx context.Context, keys []string, force bool) ([]Record, error)
	// CountRecords counts the records under prefix by handler name (every handler,
	// or only handler when it is not ""). It walks the whole key space in bounded
	// steps (SCAN on Redis, never KEYS), so it takes time in proportion to the
	// number of keys, not records.
	CountRecords(ctx context.Context, prefix, handler string) (map[string]int64, error)
}

var (
	_ RecordStore = (*RedisStore)(nil)
	_ RecordStore = (*MemoryStore)(nil)
)

// splitRecordKey splits a record key into the channel of its handler's forget
// notices ("<prefix>:<handler>") and its normalized message key. Prefixes and
// handler names hold no ':', so the second ':' ends the channel.
func splitRecordKey(rk string) (channel, k string, ok bool) {
	i := strings.IndexByte(rk, ':')
	if i <= 0 {
		return "", "", false
	}
	j := strings.IndexByte(rk[i+1:], ':')
	if j <= 0 {
		return "", "", false
	}
	return rk[:i+1+j], rk[i+1+j+1:], true
}

func inProgressErr(r Record) error {
	return fmt.Errorf("%w: its owner's lease has %v left", ErrRecordInProgress, r.TTL)
}

// keyEntries wraps record keys as batch entries (for runScripts).
func keyEntries(keys []string) []Entry {
	es := make([]Entry, len(keys))
	for i, k := range keys {
		es[i].Key = k
	}
	return es
}
