package redisstore

import (
	"fmt"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/internal/storekit"
)

// entry is a batch of one entry.
func entry(key, token, fp string, ttl time.Duration) []driver.Entry {
	return []driver.Entry{{Key: key, Token: token, Fingerprint: fp, TTL: ttl}}
}

// only is the answer to a call of one entry, and its error: the entry's own, or the
// call's; a call that answers and fails at once is an error of its own.
func only(as []driver.Answer, err error) (driver.Answer, error) {
	if err != nil && as != nil {
		return driver.Answer{}, fmt.Errorf("%d answers with the call's error %w", len(as), err)
	}
	return storekit.Only(as, err)
}

// onlyErr is only for a call that answers an error per entry.
func onlyErr(errs []error, err error) error {
	if err != nil && errs != nil {
		return fmt.Errorf("%d answers with the call's error %w", len(errs), err)
	}
	return storekit.OnlyErr(errs, err)
}
