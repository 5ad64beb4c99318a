// Package driver defines what a dedup store implements: Store, the optional
// RecordStore, HealthChecker and Pinger, and the values they exchange. A third-party
// store implements them and proves itself with dedup/storetest.
package driver

import "errors"

// Errors a store returns; package dedup re-exports them.
var (
	// ErrInvalidOption reports a bad setting or argument.
	ErrInvalidOption = errors.New("dedup: invalid option")
	// ErrLeaseLost reports that the caller no longer owns the record.
	ErrLeaseLost = errors.New("dedup: lease lost")
	// ErrStoreUnavailable reports a store that could not answer; the wrapper says why.
	ErrStoreUnavailable = errors.New("dedup: store unavailable")
	// ErrClosed reports a call on a closed Deduper or store.
	ErrClosed = errors.New("dedup: closed")
	// ErrBadRecord reports a value under a record key that dedup did not write.
	ErrBadRecord = errors.New("dedup: unrecognised record")
	// ErrRecordInProgress reports that Forget left a record IN PROGRESS alone.
	ErrRecordInProgress = errors.New("dedup: record in progress")
)
