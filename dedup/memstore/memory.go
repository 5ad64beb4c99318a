// Package memstore is an in-process dedup store, with redisstore's semantics and its
// records in a map: for tests, and for an application that runs as one process.
package memstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/internal/storekit"
)

// DefaultLimit is the number of live records a Store holds without WithLimit.
const DefaultLimit = 1 << 20

// Store is an in-process dedup store. At its limit of live records it refuses new
// ones (ErrStoreUnavailable): forgetting one early would let a duplicate through.
type Store struct {
	mu      sync.Mutex
	now     func() time.Time
	limit   int
	recs    map[string]memRecord
	nextExp time.Time // no record expires before this; a sweep before it frees nothing
	bus     memBus    // forget notices to the Dedupers on this store
}

type memRecord struct {
	state    byte
	token    string
	fp       string
	reply    string // a DONE record's stored reply, when hasReply
	hasReply bool
	expires  time.Time
}

var _ driver.Store = (*Store)(nil)

// Option configures a Store.
type Option func(*Store) error

// WithLimit bounds the number of live records (default DefaultLimit).
func WithLimit(n int) Option {
	return func(s *Store) error {
		if n < 1 {
			return fmt.Errorf("%w: memory limit %d is below 1", driver.ErrInvalidOption, n)
		}
		s.limit = n
		return nil
	}
}

// WithClock sets the time source that expires records (default time.Now).
func WithClock(now func() time.Time) Option {
	return func(s *Store) error {
		if now == nil {
			return fmt.Errorf("%w: memory clock is nil", driver.ErrInvalidOption)
		}
		s.now = now
		return nil
	}
}

func init() { storekit.RegisterInProcess((*Store)(nil)) }

// New returns an empty Store; a bad option is an error wrapping ErrInvalidOption.
func New(opts ...Option) (*Store, error) {
	s := &Store{now: time.Now, limit: DefaultLimit, recs: make(map[string]memRecord)}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil Option", driver.ErrInvalidOption)
		}
		if err := o(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Len returns the number of records held, expired ones not yet reclaimed included.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.recs)
}

// get returns the live record under key. Callers hold mu.
func (s *Store) get(key string, now time.Time) (memRecord, bool) {
	r, ok := s.recs[key]
	if ok && !now.Before(r.expires) {
		delete(s.recs, key)
		return memRecord{}, false
	}
	return r, ok
}

// put stores r under key, reclaiming expired records when the store is full.
func (s *Store) put(key string, r memRecord, now time.Time) error {
	if _, ok := s.recs[key]; !ok && len(s.recs) >= s.limit {
		if !now.Before(s.nextExp) {
			s.sweep(now)
		}
		if len(s.recs) >= s.limit {
			return fmt.Errorf("%w: memory store holds its limit of %d live records", driver.ErrStoreUnavailable, s.limit)
		}
	}
	s.set(key, r)
	return nil
}

// set stores r under key and keeps nextExp a lower bound of every expiry.
func (s *Store) set(key string, r memRecord) {
	s.recs[key] = r
	if r.expires.Before(s.nextExp) {
		s.nextExp = r.expires
	}
}

func (s *Store) sweep(now time.Time) {
	var next time.Time
	for k, r := range s.recs {
		if !now.Before(r.expires) {
			delete(s.recs, k)
		} else if next.IsZero() || r.expires.Before(next) {
			next = r.expires
		}
	}
	s.nextExp = next
}

// claim is the table's Claim for e. Callers hold mu and have checked e.
func (s *Store) claim(e driver.Entry) driver.Answer {
	now := s.now()
	r, ok := s.get(e.Key, now)
	switch {
	case !ok || (r.state == storekit.StateInProgress && r.token == e.Token):
		fp := e.Fingerprint
		if ok {
			fp = r.fp
		}
		rec := memRecord{state: storekit.StateInProgress, token: e.Token, fp: fp, expires: now.Add(e.TTL)}
		if err := s.put(e.Key, rec, now); err != nil {
			return driver.Answer{Err: err}
		}
		return driver.Answer{Status: driver.StatusAcquired}
	case r.state == storekit.StateInProgress:
		return driver.Answer{Status: driver.StatusInProgress, TTL: r.expires.Sub(now)}
	case storekit.FingerprintsDiffer(r.fp, e.Fingerprint):
		return driver.Answer{Status: driver.StatusConflict}
	default:
		return driver.Answer{Status: driver.StatusDuplicate, TTL: r.expires.Sub(now), Reply: r.reply, HasReply: r.hasReply}
	}
}

// complete completes e's claim: without a reply it writes DONE whatever the record
// holds; with one, only under its own lease (driver.Store). Callers hold mu and
// checked e.
func (s *Store) complete(e driver.Entry) error {
	now := s.now()
	if !e.HasReply {
		return s.put(e.Key, memRecord{state: storekit.StateDone, token: e.Token, fp: e.Fingerprint, expires: now.Add(e.TTL)}, now)
	}
	r, ok := s.get(e.Key, now)
	if !ok || r.token != e.Token {
		return driver.ErrLeaseLost
	}
	if r.state == storekit.StateInProgress {
		r.state, r.expires = storekit.StateDone, now.Add(e.TTL)
		if e.HasReply {
			r.reply, r.hasReply = e.Reply, true
		}
		s.set(e.Key, r)
	}
	return nil
}

// mark is the table's Mark for e. Callers hold mu and have checked e.
func (s *Store) mark(e driver.Entry) driver.Answer {
	now := s.now()
	r, ok := s.get(e.Key, now)
	switch {
	case !ok:
		rec := memRecord{state: storekit.StateDone, token: e.Token, fp: e.Fingerprint, expires: now.Add(e.TTL)}
		if err := s.put(e.Key, rec, now); err != nil {
			return driver.Answer{Err: err}
		}
		return driver.Answer{Status: driver.StatusAcquired}
	case r.state == storekit.StateDone && r.token == e.Token:
		return driver.Answer{Status: driver.StatusAcquired}
	case r.state == storekit.StateDone && storekit.FingerprintsDiffer(r.fp, e.Fingerprint):
		return driver.Answer{Status: driver.StatusConflict}
	case r.state == storekit.StateInProgress:
		return driver.Answer{Status: driver.StatusInProgress}
	default:
		return driver.Answer{Status: driver.StatusDuplicate}
	}
}

// release deletes e's claim. Callers hold mu and have checked e.
func (s *Store) release(e driver.Entry) error {
	if r, ok := s.get(e.Key, s.now()); ok && r.state == storekit.StateInProgress && r.token == e.Token {
		delete(s.recs, e.Key)
	}
	return nil
}

// extend renews e's lease. Callers hold mu and have checked e.
func (s *Store) extend(e driver.Entry) error {
	now := s.now()
	r, ok := s.get(e.Key, now)
	if !ok || r.state != storekit.StateInProgress || r.token != e.Token {
		return driver.ErrLeaseLost
	}
	r.expires = now.Add(e.TTL)
	s.set(e.Key, r)
	return nil
}

// Claim implements driver.Store, under one lock.
func (s *Store) Claim(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	return s.answers(entries, "lease", s.claim)
}

// Mark implements driver.Store, under one lock.
func (s *Store) Mark(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	return s.answers(entries, "retention", s.mark)
}

// Complete implements driver.Store, under one lock.
func (s *Store) Complete(ctx context.Context, entries []driver.Entry) ([]error, error) {
	return s.errs(entries, "retention", s.complete)
}

// Release implements driver.Store, under one lock. Entry.TTL is not read.
func (s *Store) Release(ctx context.Context, entries []driver.Entry) ([]error, error) {
	return s.errs(entries, "", s.release)
}

// Extend implements driver.Store, under one lock.
func (s *Store) Extend(ctx context.Context, entries []driver.Entry) ([]error, error) {
	return s.errs(entries, "lease", s.extend)
}

// answers checks every entry (storekit.CheckEntries), then runs op on each under mu.
func (s *Store) answers(entries []driver.Entry, what string, op func(driver.Entry) driver.Answer) ([]driver.Answer, error) {
	if err := storekit.CheckEntries(entries, what); err != nil {
		return nil, err
	}
	if len(entries) == 0 {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]driver.Answer, len(entries))
	for i, e := range entries {
		out[i] = op(e)
	}
	return out, nil
}

// errs is answers for an op whose entries answer an error alone.
func (s *Store) errs(entries []driver.Entry, what string, op func(driver.Entry) error) ([]error, error) {
	if err := storekit.CheckEntries(entries, what); err != nil {
		return nil, err
	}
	if len(entries) == 0 {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]error, len(entries))
	for i, e := range entries {
		out[i] = op(e)
	}
	return out, nil
}

// CheckHealth implements driver.HealthChecker: reachable, with its fill.
func (s *Store) CheckHealth(context.Context) []driver.HealthCheck {
	return []driver.HealthCheck{{Name: driver.CheckStoreReachable, Status: driver.HealthOK, Value: "memory",
		Detail: fmt.Sprintf("in process: %d of %d records", s.Len(), s.limit)}}
}
