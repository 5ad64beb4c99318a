package storekit

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/keys"
)

// SplitRecordKey splits a record key into its handler's notice channel
// ("<prefix>:<handler>") and its message key; the second ':' ends the channel.
func SplitRecordKey(rk string) (channel, k string, ok bool) {
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

// InProgressErr is Forget's error for a record it left alone.
func InProgressErr(r driver.Record) error {
	return fmt.Errorf("%w: its owner's lease has %v left", driver.ErrRecordInProgress, r.TTL)
}

// KeyEntries wraps record keys as batch entries.
func KeyEntries(keys []string) []driver.Entry {
	es := make([]driver.Entry, len(keys))
	for i, k := range keys {
		es[i].Key = k
	}
	return es
}

// RecordOf reads a record's stored value and remaining life.
func RecordOf(v string, ttl time.Duration) (driver.Record, error) {
	rec, ok := Parse(v)
	if !ok {
		return driver.Record{}, driver.ErrBadRecord
	}
	r := driver.Record{State: driver.RecordDone, Owner: rec.Token, Fingerprint: rec.FP, TTL: max(ttl, 0)}
	if rec.State == StateInProgress {
		r.State = driver.RecordInProgress
	}
	if rec.HasReply {
		r.ReplySize, r.HasReply, r.Reply = len(rec.Reply), true, rec.Reply
	}
	return r, nil
}

// ValidName checks a handler name, wrapping ErrInvalidOption.
func ValidName(name string) error {
	if err := keys.ValidateName(name); err != nil {
		return fmt.Errorf("%w: handler name: %w", driver.ErrInvalidOption, err)
	}
	return nil
}

// IsNil reports an interface that is nil or holds a nil pointer (or map, func...).
func IsNil(v any) bool {
	if v == nil {
		return true
	}
	switch r := reflect.ValueOf(v); r.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Chan, reflect.Slice, reflect.Interface:
		return r.IsNil()
	}
	return false
}

// HandlerOf returns the handler name of a record key under prefix.
func HandlerOf(rk, prefix string) (string, bool) {
	channel, k, ok := SplitRecordKey(rk)
	if !ok || k == "" || len(channel) <= len(prefix)+1 || channel[:len(prefix)] != prefix {
		return "", false
	}
	name := channel[len(prefix)+1:]
	return name, keys.ValidateName(name) == nil
}

// StoreErr wraps a store failure of op in ErrStoreUnavailable (once).
func StoreErr(op string, err error) error {
	if errors.Is(err, driver.ErrStoreUnavailable) {
		return err
	}
	if strings.Contains(err.Error(), driver.ErrBadRecord.Error()) {
		return fmt.Errorf("%w: %s: %w", driver.ErrStoreUnavailable, op, driver.ErrBadRecord)
	}
	return fmt.Errorf("%w: %s: %w", driver.ErrStoreUnavailable, op, err)
}

// inProcess holds the store types whose calls never wait on a network (memstore).
var inProcess sync.Map // reflect.Type → struct{}

// RegisterInProcess records the type of s as a store that never waits on a network:
// dedup calls it on the caller's goroutine. An exact type: a wrapper is not one.
func RegisterInProcess(s any) { inProcess.Store(reflect.TypeOf(s), struct{}{}) }

// IsInProcess reports whether s's type was registered with RegisterInProcess.
func IsInProcess(s any) bool {
	_, ok := inProcess.Load(reflect.TypeOf(s))
	return ok
}

// Only is the answer to a store call of one entry, and its error: the call's, else
// the entry's (moved out of the answer). Any number of answers but one is an error
// wrapping ErrStoreUnavailable.
func Only(as []driver.Answer, err error) (driver.Answer, error) {
	switch {
	case err != nil:
		return driver.Answer{}, err
	case len(as) != 1:
		return driver.Answer{}, fmt.Errorf("%w: %d answers to one entry", driver.ErrStoreUnavailable, len(as))
	}
	a := as[0]
	err, a.Err = a.Err, nil
	return a, err
}

// OnlyErr is Only for a call that answers an error per entry.
func OnlyErr(errs []error, err error) error {
	switch {
	case err != nil:
		return err
	case len(errs) != 1:
		return fmt.Errorf("%w: %d answers to one entry", driver.ErrStoreUnavailable, len(errs))
	}
	return errs[0]
}

// KeyHash names a key in log lines without revealing it: the hex of the first 8
// bytes of its SHA-256.
func KeyHash(k string) string {
	sum := sha256.Sum256([]byte(k))
	return hex.EncodeToString(sum[:8])
}

// Worst is the worst of the checks' statuses (unknown counts as ok).
func Worst(cs []driver.HealthCheck) driver.HealthStatus {
	s := driver.HealthOK
	for _, c := range cs {
		switch c.Status {
		case driver.HealthFail:
			return driver.HealthFail
		case driver.HealthWarn:
			s = driver.HealthWarn
		}
	}
	return s
}
