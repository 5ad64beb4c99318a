package dedup

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// DefaultMemoryLimit is the number of records a MemoryStore holds unless WithMemoryLimit
// says otherwise.
const DefaultMemoryLimit = 1 << 20

// MemoryStore is a Store for one process: the same semantics as RedisStore, with
// records in a map. It is bounded: when it holds its limit of live records it refuses
// new ones with ErrStoreUnavailable rather than forget a record early (forgetting would
// let a duplicate through). Expired records are reclaimed lazily.
type MemoryStore struct {
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

var _ ReplyStore = (*MemoryStore)(nil)

// MemoryOption configures a MemoryStore.
type MemoryOption func(*MemoryStore) error

// WithMemoryLimit bounds the number of live records (default DefaultMemoryLimit).
func WithMemoryLimit(n int) MemoryOption {
	return func(s *MemoryStore) error {
		if n < 1 {
			return fmt.Errorf("%w: memory limit %d is below 1", ErrInvalidOption, n)
		}
		s.limit = n
		return nil
	}
}

// WithMemoryClock sets the time source that expires records (default time.Now).
func WithMemoryClock(now func() time.Time) MemoryOption {
	return func(s *MemoryStore) error {
		if now == nil {
			return fmt.Errorf("%w: memory clock is nil", ErrInvalidOption)
		}
		s.now = now
		return nil
	}
}

// NewMemoryStore returns an empty MemoryStore. A bad option is an error wrapping
// ErrInvalidOption.
func NewMemoryStore(opts ...MemoryOption) (*MemoryStore, error) {
	s := &MemoryStore{now: time.Now, limit: DefaultMemoryLimit, recs: make(map[string]memRecord)}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil MemoryOption", ErrInvalidOption)
		}
		if err := o(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Len returns the number of records held, expired ones not yet reclaimed included.
func (s *MemoryStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.recs)
}

// get returns the live record under key. Callers hold mu.
func (s *MemoryStore) get(key string, now time.Time) (memRecord, bool) {
	r, ok := s.recs[key]
	if ok && !now.Before(r.expires) {
		delete(s.recs, key)
		return memRecord{}, false
	}
	return r, ok
}

// put stores r under key, reclaiming expired records when the store is full.
func (s *MemoryStore) put(key string, r memRecord, now time.Time) error {
	if _, ok := s.recs[key]; !ok && len(s.recs) >= s.limit {
		if !now.Before(s.nextExp) {
			s.sweep(now)
		}
		if len(s.recs) >= s.limit {
			return fmt.Errorf("%w: memory store holds its limit of %d live records", ErrStoreUnavailable, s.limit)
		}
	}
	s.set(key, r)
	return nil
}

// set stores r under key and keeps nextExp a lower bound of every expiry.
func (s *MemoryStore) set(key string, r memRecord) {
	s.recs[key] = r
	if r.expires.Before(s.nextExp) {
		s.nextExp = r.expires
	}
}

func (s *MemoryStore) sweep(now time.Time) {
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

func (s *MemoryStore) claim(key, token, fp string, lease time.Duration) (Answer, error) {
	if err := checkEntry(Entry{Token: token, TTL: lease}, "lease"); err != nil {
		return Answer{}, err
	}
	now := s.now()
	r, ok := s.get(key, now)
	switch {
	case !ok || (r.state == stateInProgress && r.token == token):
		if ok {
			fp = r.fp
		}
		rec := memRecord{state: stateInProgress, token: token, fp: fp, expires: now.Add(lease)}
		if err := s.put(key, rec, now); err != nil {
			return Answer{}, err
		}
		return Answer{Status: StatusAcquired}, nil
	case r.state == stateInProgress:
		return Answer{Status: StatusInProgress, TTL: r.expires.Sub(now)}, nil
	case fingerprintsDiffer(r.fp, fp):
		return Answer{Status: StatusConflict}, nil
	default:
		return Answer{Status: StatusDuplicate, TTL: r.expires.Sub(now), Reply: r.reply, HasReply: r.hasReply}, nil
	}
}

// complete completes e's claim, with e's reply when it has one.
func (s *MemoryStore) complete(e Entry) error {
	if err := checkEntry(e, "retention"); err != nil {
		return err
	}
	now := s.now()
	r, ok := s.get(e.Key, now)
	if !ok || r.token != e.Token {
		return ErrLeaseLost
	}
	if r.state == stateInProgress {
		r.state, r.expires = stateDone, now.Add(e.TTL)
		if e.HasReply {
			r.reply, r.hasReply = e.Reply, true
		}
		s.set(e.Key, r)
	}
	return nil
}

func (s *MemoryStore) mark(key, token, fp string, retention time.Duration) (Answer, error) {
	if err := checkEntry(Entry{Token: token, TTL: retention}, "retention"); err != nil {
		return Answer{}, err
	}
	now := s.now()
	r, ok := s.get(key, now)
	switch {
	case !ok:
		rec := memRecord{state: stateDone, token: token, fp: fp, expires: now.Add(retention)}
		if err := s.put(key, rec, now); err != nil {
			return Answer{}, err
		}
		return Answer{Status: StatusAcquired}, nil
	case r.state == stateDone && r.token == token:
		return Answer{Status: StatusAcquired}, nil
	case r.state == stateDone && fingerprintsDiffer(r.fp, fp):
		return Answer{Status: StatusConflict}, nil
	case r.state == stateInProgress:
		return Answer{Status: StatusInProgress}, nil
	default:
		return Answer{Status: StatusDuplicate}, nil
	}
}

// Claim implements Store.
func (s *MemoryStore) Claim(ctx context.Context, key, token, fingerprint string, lease time.Duration) (Answer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.claim(key, token, fingerprint, lease)
}

// Complete implements Store.
func (s *MemoryStore) Complete(ctx context.Context, key, token string, retention time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.complete(Entry{Key: key, Token: token, TTL: retention})
}

// CompleteReply implements ReplyStore.
func (s *MemoryStore) CompleteReply(ctx context.Context, key, token, reply string, retention time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.complete(Entry{Key: key, Token: token, TTL: retention, Reply: reply, HasReply: true})
}

// Release implements Store.
func (s *MemoryStore) Release(ctx context.Context, key, token string) error {
	if err := checkToken(token); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.get(key, s.now()); ok && r.state == stateInProgress && r.token == token {
		delete(s.recs, key)
	}
	return nil
}

// Extend implements Store.
func (s *MemoryStore) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if err := checkEntry(Entry{Token: token, TTL: lease}, "lease"); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	r, ok := s.get(key, now)
	if !ok || r.state != stateInProgress || r.token != token {
		return ErrLeaseLost
	}
	r.expires = now.Add(lease)
	s.set(key, r)
	return nil
}

// Mark implements Store.
func (s *MemoryStore) Mark(ctx context.Context, key, token, fingerprint string, retention time.Duration) (Answer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mark(key, token, fingerprint, retention)
}

// ClaimMany implements Store under one lock.
func (s *MemoryStore) ClaimMany(ctx context.Context, entries []Entry) ([]Answer, error) {
	return s.many(entries, "lease", func(e Entry) Answer {
		a, err := s.claim(e.Key, e.Token, e.Fingerprint, e.TTL)
		a.Err = err
		return a
	})
}

// MarkMany implements Store under one lock.
func (s *MemoryStore) MarkMany(ctx context.Context, entries []Entry) ([]Answer, error) {
	return s.many(entries, "retention", func(e Entry) Answer {
		a, err := s.mark(e.Key, e.Token, e.Fingerprint, e.TTL)
		a.Err = err
		return a
	})
}

// CompleteMany implements Store (and ReplyStore: an entry's reply is stored with its
// DONE record) under one lock.
func (s *MemoryStore) CompleteMany(ctx context.Context, entries []Entry) ([]error, error) {
	ans, err := s.many(entries, "retention", func(e Entry) Answer {
		return Answer{Err: s.complete(e)}
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

func (s *MemoryStore) many(entries []Entry, what string, op func(Entry) Answer) ([]Answer, error) {
	for _, e := range entries {
		if err := checkEntry(e, what); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Answer, len(entries))
	for i, e := range entries {
		out[i] = op(e)
	}
	return out, nil
}
