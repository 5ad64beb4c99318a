package dedup

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
)

// hookStore wraps a Store, counting calls per operation and letting a test inject an
// error into any of them.
type hookStore struct {
	driver.Store
	claims, completes, releases, extends, marks, batches atomic.Int64
	completeManys                                        atomic.Int64 // also counted in batches
	// fail, when set, is asked before each call; a non-nil error is returned instead.
	fail atomic.Pointer[func(op string) error]
}

func (s *hookStore) onFail(f func(op string) error) { s.fail.Store(&f) }

func (s *hookStore) hook(op string, n *atomic.Int64) error {
	n.Add(1)
	if f := s.fail.Load(); f != nil {
		return (*f)(op)
	}
	return nil
}

func (s *hookStore) Claim(ctx context.Context, key, token, fp string, lease time.Duration) (driver.Answer, error) {
	if err := s.hook("claim", &s.claims); err != nil {
		return driver.Answer{}, err
	}
	return s.Store.Claim(ctx, key, token, fp, lease)
}

func (s *hookStore) Complete(ctx context.Context, key, token string, retention time.Duration) error {
	if err := s.hook("complete", &s.completes); err != nil {
		return err
	}
	return s.Store.Complete(ctx, key, token, retention)
}

func (s *hookStore) Release(ctx context.Context, key, token string) error {
	if err := s.hook("release", &s.releases); err != nil {
		return err
	}
	return s.Store.Release(ctx, key, token)
}

func (s *hookStore) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if err := s.hook("extend", &s.extends); err != nil {
		return err
	}
	return s.Store.Extend(ctx, key, token, lease)
}

func (s *hookStore) Mark(ctx context.Context, key, token, fp string, retention time.Duration) (driver.Answer, error) {
	if err := s.hook("mark", &s.marks); err != nil {
		return driver.Answer{}, err
	}
	return s.Store.Mark(ctx, key, token, fp, retention)
}

func (s *hookStore) ClaimMany(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	if err := s.hook("claim-many", &s.batches); err != nil {
		return nil, err
	}
	return s.Store.ClaimMany(ctx, entries)
}

func (s *hookStore) MarkMany(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	if err := s.hook("mark-many", &s.batches); err != nil {
		return nil, err
	}
	return s.Store.MarkMany(ctx, entries)
}

func (s *hookStore) CompleteMany(ctx context.Context, entries []driver.Entry) ([]error, error) {
	s.completeManys.Add(1)
	if err := s.hook("complete-many", &s.batches); err != nil {
		return nil, err
	}
	return s.Store.CompleteMany(ctx, entries)
}

// replyHookStore is a hookStore over a ReplyStore that is one too: CompleteReply is
// hooked as "complete-reply".
type replyHookStore struct{ *hookStore }

func (s replyHookStore) CompleteReply(ctx context.Context, key, token, reply string, retention time.Duration) error {
	if err := s.hook("complete-reply", &s.completes); err != nil {
		return err
	}
	return s.Store.(driver.ReplyStore).CompleteReply(ctx, key, token, reply, retention)
}
