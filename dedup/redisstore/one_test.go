package redisstore

import (
	"fmt"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
)

// entry is a batch of one entry.
func entry(key, token, fp string, ttl time.Duration) []driver.Entry {
	return []driver.Entry{{Key: key, Token: token, Fingerprint: fp, TTL: ttl}}
}

// only is the answer to a call of one entry, and its error: the entry's own, or the
// call's.
func only(as []driver.Answer, err error) (driver.Answer, error) {
	if err != nil {
		if as != nil {
			return driver.Answer{}, fmt.Errorf("%d answers with the call's error %w", len(as), err)
		}
		return driver.Answer{}, err
	}
	if len(as) != 1 {
		return driver.Answer{}, fmt.Errorf("%d answers for one entry", len(as))
	}
	a := as[0]
	err, a.Err = a.Err, nil
	return a, err
}

// onlyErr is only for a call that answers an error per entry.
func onlyErr(errs []error, err error) error {
	if err != nil {
		if errs != nil {
			return fmt.Errorf("%d answers with the call's error %w", len(errs), err)
		}
		return err
	}
	if len(errs) != 1 {
		return fmt.Errorf("%d answers for one entry", len(errs))
	}
	return errs[0]
}
