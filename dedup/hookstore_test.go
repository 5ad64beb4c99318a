package dedup

import (
	"context"
	"sync/atomic"

	"github.com/dedupkit/dedupkit/dedup/driver"
)

// hookStore wraps a Store, counting calls per operation (batches: the calls of more
// than one entry; completeManys: such Completes) and letting a test inject an error
// into any of them. A call of one entry is hooked as "claim", "mark", "complete" (or
// "complete-reply" with a reply), "release" or "extend"; a call of several as
// "claim-many", "mark-many", "complete-many", "release-many" or "extend-many".
type hookStore struct {
	driver.Store
	claims, completes, releases, extends, marks, batches atomic.Int64
	completeManys                                        atomic.Int64 // also counted in batches
	extendEntries                                        atomic.Int64 // the entries of every Extend
	// fail, when set, is asked before each call; a non-nil error is returned instead.
	fail atomic.Pointer[func(op string) error]
}

func (s *hookStore) onFail(f func(op string) error) { s.fail.Store(&f) }

func (s *hookStore) hook(op string, entries []driver.Entry, calls *atomic.Int64) error {
	calls.Add(1)
	if len(entries) == 1 {
		if op == "complete" && entries[0].HasReply {
			op = "complete-reply"
		}
	} else {
		s.batches.Add(1)
		if op == "complete" {
			s.completeManys.Add(1)
		}
		op += "-many"
	}
	if f := s.fail.Load(); f != nil {
		return (*f)(op)
	}
	return nil
}

func (s *hookStore) Claim(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	if err := s.hook("claim", entries, &s.claims); err != nil {
		return nil, err
	}
	return s.Store.Claim(ctx, entries)
}

func (s *hookStore) Mark(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	if err := s.hook("mark", entries, &s.marks); err != nil {
		return nil, err
	}
	return s.Store.Mark(ctx, entries)
}

func (s *hookStore) Complete(ctx context.Context, entries []driver.Entry) ([]error, error) {
	if err := s.hook("complete", entries, &s.completes); err != nil {
		return nil, err
	}
	return s.Store.Complete(ctx, entries)
}

func (s *hookStore) Release(ctx context.Context, entries []driver.Entry) ([]error, error) {
	if err := s.hook("release", entries, &s.releases); err != nil {
		return nil, err
	}
	return s.Store.Release(ctx, entries)
}

func (s *hookStore) Extend(ctx context.Context, entries []driver.Entry) ([]error, error) {
	s.extendEntries.Add(int64(len(entries)))
	if err := s.hook("extend", entries, &s.extends); err != nil {
		return nil, err
	}
	return s.Store.Extend(ctx, entries)
}
