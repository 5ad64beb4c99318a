package dedup

import (
	"errors"

	"github.com/dedupkit/dedupkit/dedup/driver"
)

// Sentinel errors. Every error the package returns wraps one of these, or
// errors.ErrUnsupported (a store without RecordStore), or is the handler's own error,
// returned as is; callers test them with errors.Is.
var (
	// ErrInvalidOption reports a bad setting at construction (New, Register,
	// redisstore.New or memstore.New; the wrapping error names the setting), a bad
	// argument (a nil context, fn, handler or transactor; a bad RunOption; an empty
	// key given to Lookup or Forget; a bad token given to a store), or a call the
	// handler does not take (Do, Handle, Mark, DoTx or RunTx on a handler
	// WithReplies; SetReply outside a Run's fn). Nothing ran; the result's Outcome is
	// the zero Outcome.
	ErrInvalidOption = driver.ErrInvalidOption

	// ErrLeaseLost reports that the caller no longer owns the record: its lease expired
	// and the record was deleted or claimed by another owner, or it was never claimed.
	ErrLeaseLost = driver.ErrLeaseLost

	// ErrStoreUnavailable reports that the store could not answer (a Redis error, a
	// timeout, a full memory store). The wrapping error holds the cause.
	ErrStoreUnavailable = driver.ErrStoreUnavailable

	// ErrNotRecorded reports that the handler succeeded but the DONE record could not be
	// written, so a later delivery of the same key may run the handler again.
	ErrNotRecorded = errors.New("dedup: processed but not recorded")

	// ErrPanic reports that the handler panicked; the wrapping error holds the value.
	ErrPanic = errors.New("dedup: handler panicked")

	// ErrClosed reports a call on a closed Deduper, or a handler cancelled by Close.
	ErrClosed = driver.ErrClosed

	// ErrBadRecord reports a value under a record key that dedup did not write (another
	// program shares the prefix). The record is left alone and the message is not dropped.
	ErrBadRecord = driver.ErrBadRecord

	// ErrReplyTooLarge reports a reply larger than the handler's WithReplies limit:
	// the message was processed (Processed: its DONE record is written, without the
	// reply) but its duplicates cannot get the reply back; they answer Duplicate with
	// HasReply false. Counted in Stats.RepliesTooLarge.
	ErrReplyTooLarge = errors.New("dedup: reply too large to store")

	// ErrRecordInProgress reports that Forget left a record alone because it is IN
	// PROGRESS: its owner is running the handler. ForgetInProgress forces it.
	ErrRecordInProgress = driver.ErrRecordInProgress
)
