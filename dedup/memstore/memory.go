package memstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/internal/storekit"
)

// DefaultLimit is the number of records a Store holds unless WithLimit
// says otherwise.
const DefaultLimit = 1 << 20

// Store is a Store for one process: the same semantics as redisstore.Store, with
// records in a map. It is bounded: when it holds its limit of live records it refuses
// new ones with ErrStoreUnavailable rather than forget a record early (forgetting would
// let a duplicate through). Expired records are reclaimed lazily.
type Store struct {
	mu      sync.Mutex
	now     func() time.Time
	limit   int
	recs    map[string]memRecord
	nextExp time.Time // no record expires before this; a sweep before it frees nothing
	bus     memBus    // forget notices to the Dedupers on this store (memory_records.go)
}

type memRecord struct {
	state    byte
	token    string
	fp       string
	reply    string // a DONE record's stored reply, when hasReply
	hasReply bool
	expires  time.Time
}

var _ driver.ReplyStore = (*Store)(nil)

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

// New returns an empty Store. A bad option is an error wrapping
// ErrInvalidOption.
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

func (s *Store) claim(key, token, fp string, lease time.Duration) (driver.Answer, error) {
	if err := storekit.CheckEntry(driver.Entry{Token: token, TTL: lease}, "lease"); err != nil {
		return driver.Answer{}, err
	}
	now := s.now()
	r, ok := s.get(key, now)
	switch {
	case !ok || (r.state == storekit.StateInProgress && r.token == token):
		if ok {
			fp = r.fp
		}
		rec := memRecord{state: storekit.StateInProgress, token: token, fp: fp, expires: now.Add(lease)}
		if err := s.put(key, rec, now); err != nil {
			return driver.Answer{}, err
		}
		return driver.Answer{Status: driver.StatusAcquired}, nil
	case r.state == storekit.StateInProgress:
		return driver.Answer{Status: driver.StatusInProgress, TTL: r.expires.Sub(now)}, nil
	case storekit.FingerprintsDiffer(r.fp, fp):
		return driver.Answer{Status: driver.StatusConflict}, nil
	default:
		return driver.Answer{Status: driver.StatusDuplicate, TTL: r.expires.Sub(now), Reply: r.reply, HasReply: r.hasReply}, nil
	}
}

// complete completes e's claim, with e's reply when it has one.
func (s *Store) complete(e driver.Entry) error {
	if err := storekit.CheckEntry(e, "retention"); err != nil {
		return err
	}
	now := s.now()
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

func (s *Store) mark(key, token, fp string, retention time.Duration) (driver.Answer, error) {
	if err := storekit.CheckEntry(driver.Entry{Token: token, TTL: retention}, "retention"); err != nil {
		return driver.Answer{}, err
	}
	now := s.now()
	r, ok := s.get(key, now)
	switch {
	case !ok:
		rec := memRecord{state: storekit.StateDone, token: token, fp: fp, expires: now.Add(retention)}
		if err := s.put(key, rec, now); err != nil {
			return driver.Answer{}, err
		}
		return driver.Answer{Status: driver.StatusAcquired}, nil
	case r.state == storekit.StateDone && r.token == token:
		return driver.Answer{Status: driver.StatusAcquired}, nil
	case r.state == storekit.StateDone && storekit.FingerprintsDiffer(r.fp, fp):
		return driver.Answer{Status: driver.StatusConflict}, nil
	case r.state == storekit.StateInProgress:
		return driver.Answer{Status: driver.StatusInProgress}, nil
	default:
		return driver.Answer{Status: driver.StatusDuplicate}, nil
	}
}

// Claim implements Store.
func (s *Store) Claim(ctx context.Context, key, token, fingerprint string, lease time.Duration) (driver.Answer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.claim(key, token, fingerprint, lease)
}

// Complete implements Store.
func (s *Store) Complete(ctx context.Context, key, token string, retention time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.complete(driver.Entry{Key: key, Token: token, TTL: retention})
}

// CompleteReply implements ReplyStore.
func (s *Store) CompleteReply(ctx context.Context, key, token, reply string, retention time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.complete(driver.Entry{Key: key, Token: token, TTL: retention, Reply: reply, HasReply: true})
}

// Release implements Store.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := storekit.CheckToken(token); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.get(key, s.now()); ok && r.state == storekit.StateInProgress && r.token == token {
		delete(s.recs, key)
	}
	return nil
}

// Extend implements Store.
func (s *Store) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if err := storekit.CheckEntry(driver.Entry{Token: token, TTL: lease}, "lease"); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	r, ok := s.get(key, now)
	if !ok || r.state != storekit.StateInProgress || r.token != token {
		return driver.ErrLeaseLost
	}
	r.expires = now.Add(lease)
	s.set(key, r)
	return nil
}

// Mark implements Store.
func (s *Store) Mark(ctx context.Context, key, token, fingerprint string, retention time.Duration) (driver.Answer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mark(key, token, fingerprint, retention)
}

// ClaimMany implements Store under one lock.
func (s *Store) ClaimMany(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	return s.many(entries, "lease", func(e driver.Entry) driver.Answer {
		a, err := s.claim(e.Key, e.Token, e.Fingerprint, e.TTL)
		a.Err = err
		return a
	})
}

// MarkMany implements Store under one lock.
func (s *Store) MarkMany(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	return s.many(entries, "retention", func(e driver.Entry) driver.Answer {
		a, err := s.mark(e.Key, e.Token, e.Fingerprint, e.TTL)
		a.Err = err
		return a
	})
}

// CompleteMany implements Store (and ReplyStore: an entry's reply is stored with its
// DONE record) under one lock.
func (s *Store) CompleteMany(ctx context.Context, entries []driver.Entry) ([]error, error) {
	ans, err := s.many(entries, "retention", func(e driver.Entry) driver.Answer {
		return driver.Answer{Err: s.complete(e)}
	})
	if err != nil {
		return nil, err
	}
	out := make([]error, len(ans))
	for i, a := range ans {
		out[i] = a.Err
	}
	return out, nil
}

func (s *Store) many(entries []driver.Entry, what string, op func(driver.Entry) driver.Answer) ([]driver.Answer, error) {
	for _, e := range entries {
		if err := storekit.CheckEntry(e, what); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]driver.Answer, len(entries))
	for i, e := range entries {
		out[i] = op(e)
	}
	return out, nil
}

// CheckHealth implements driver.HealthChecker: a memory store is always reachable;
// the detail says how many records it holds of its limit.
func (s *Store) CheckHealth(context.Context) []driver.HealthCheck {
	return []driver.HealthCheck{{Name: driver.CheckStoreReachable, Status: driver.HealthOK, Value: "memory",
		Detail: fmt.Sprintf("in process: %d of %d records", s.Len(), s.limit)}}
}
