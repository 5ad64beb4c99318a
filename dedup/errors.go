package dedup

import (
	"errors"

	"github.com/dedupkit/dedupkit/dedup/driver"
)

// Errors returned by this package wrap one of these (or errors.ErrUnsupported for a
// store without driver.RecordStore), except fn's own error, returned as is. Test
// them with errors.Is.
var (
	// ErrInvalidOption reports a bad setting, a bad argument (a nil context, fn or
	// handler, an empty key) or a call the handler does not take. Nothing ran.
	ErrInvalidOption = driver.ErrInvalidOption

	// ErrLeaseLost reports that the caller does not own the record: its lease
	// expired, or another owner holds it.
	ErrLeaseLost = driver.ErrLeaseLost

	// ErrStoreUnavailable reports that the store could not answer; the wrapping error
	// holds the cause.
	ErrStoreUnavailable = driver.ErrStoreUnavailable

	// ErrNotRecorded reports that fn succeeded but DONE could not be written, so a
	// redelivery may run fn again.
	ErrNotRecorded = errors.New("dedup: processed but not recorded")

	// ErrPanic reports that fn panicked; the wrapping error holds the value.
	ErrPanic = errors.New("dedup: handler panicked")

	// ErrClosed reports a call on a closed Deduper, or a fn cancelled by Close.
	ErrClosed = driver.ErrClosed

	// ErrBadRecord reports a value under a record key that dedup did not write. It is
	// left alone, and the message is not dropped.
	ErrBadRecord = driver.ErrBadRecord

	// ErrReplyTooLarge reports a reply over the WithReplies limit: the message was
	// processed, but the reply was not stored for its duplicates.
	ErrReplyTooLarge = errors.New("dedup: reply too large to store")

	// ErrRecordInProgress reports that Forget left a record IN PROGRESS alone (see
	// ForgetInProgress).
	ErrRecordInProgress = driver.ErrRecordInProgress
)
