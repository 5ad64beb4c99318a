package memstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/internal/storekit"
	"github.com/dedupkit/dedupkit/keys"
)

// Lookup implements driver.RecordStore.
func (s *Store) Lookup(ctx context.Context, keys []string) ([]driver.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	out := make([]driver.Record, len(keys))
	for i, k := range keys {
		out[i] = s.record(k, now)
	}
	return out, nil
}

// record returns what key holds. Callers hold mu.
func (s *Store) record(key string, now time.Time) driver.Record {
	r, ok := s.get(key, now)
	if !ok {
		return driver.Record{}
	}
	rec := driver.Record{State: driver.RecordDone, Owner: r.token, Fingerprint: r.fp, TTL: r.expires.Sub(now)}
	if r.state == storekit.StateInProgress {
		rec.State = driver.RecordInProgress
	}
	if r.hasReply {
		rec.ReplySize, rec.HasReply, rec.Reply = len(r.reply), true, r.reply
	}
	return rec
}

// Forget implements driver.RecordStore. Its forget notices reach the subscribed
// Dedupers before it returns; one whose queue is full drops its local tiers instead.
func (s *Store) Forget(ctx context.Context, keys []string, force bool) ([]driver.Record, error) {
	for _, k := range keys {
		if _, _, ok := storekit.SplitRecordKey(k); !ok {
			return nil, fmt.Errorf("%w: %q is not a record key (<prefix>:<handler>:<key>)", driver.ErrInvalidOption, k)
		}
	}
	out := make([]driver.Record, len(keys))
	s.mu.Lock()
	now := s.now()
	for i, k := range keys {
		out[i] = s.record(k, now)
		if out[i].State == driver.RecordInProgress && !force {
			out[i].Err = storekit.InProgressErr(out[i])
			continue
		}
		delete(s.recs, k)
	}
	s.mu.Unlock()
	for i, k := range keys {
		if out[i].Err == nil {
			channel, mk, _ := storekit.SplitRecordKey(k)
			out[i].Notified = s.bus.publish(channel, mk)
		}
	}
	return out, nil
}

// CountRecords implements driver.RecordStore: the live records under prefix, by handler.
func (s *Store) CountRecords(ctx context.Context, prefix, handler string) (map[string]int64, error) {
	if err := keys.ValidatePrefix(prefix); err != nil {
		return nil, fmt.Errorf("%w: %w", driver.ErrInvalidOption, err)
	}
	if handler != "" {
		if err := storekit.ValidName(handler); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	counts := make(map[string]int64)
	for k, r := range s.recs {
		if !now.Before(r.expires) || !strings.HasPrefix(k, prefix+":") {
			continue
		}
		if name, ok := storekit.HandlerOf(k, prefix); ok && (handler == "" || name == handler) {
			counts[name]++
		}
	}
	return counts, nil
}

// subscribeNotices returns a subscription in this process.
func (s *Store) subscribeNotices() storekit.Sub {
	sub := &memNotices{bus: &s.bus, events: make(chan storekit.Notice, memNoticeQueue), done: make(chan struct{}), channels: make(map[string]bool)}
	s.bus.mu.Lock()
	if s.bus.subs == nil {
		s.bus.subs = make(map[*memNotices]struct{})
	}
	s.bus.subs[sub] = struct{}{}
	s.bus.mu.Unlock()
	return sub
}

// noticeSubscribers counts the subscriptions that hold channel.
func (s *Store) noticeSubscribers(_ context.Context, channel string) (int64, error) {
	s.bus.mu.Lock()
	defer s.bus.mu.Unlock()
	var n int64
	for sub := range s.bus.subs {
		if sub.has(channel) {
			n++
		}
	}
	return n, nil
}

// memNoticeQueue bounds the notices waiting for one subscriber of a Store.
const memNoticeQueue = 1024

// memBus carries a Store's forget notices to its subscribers.
type memBus struct {
	mu   sync.Mutex
	subs map[*memNotices]struct{}
}

// publish queues a notice for every subscriber of channel and returns how many.
func (b *memBus) publish(channel, k string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for sub := range b.subs {
		if sub.has(channel) {
			sub.put(storekit.Notice{Kind: storekit.Forgotten, Channel: channel, K: k})
			n++
		}
	}
	return n
}

// memNotices is a subscription to a Store's notices: a bounded queue. One that falls
// a whole queue behind loses notices, and its next Receive says so (Missed).
type memNotices struct {
	bus    *memBus
	events chan storekit.Notice
	done   chan struct{}
	once   sync.Once

	mu       sync.Mutex
	channels map[string]bool
	overflow bool
}

func (m *memNotices) has(channel string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.channels[channel]
}

func (m *memNotices) put(n storekit.Notice) {
	select {
	case m.events <- n:
	default:
		m.mu.Lock()
		m.overflow = true
		m.mu.Unlock()
	}
}

func (m *memNotices) Add(_ context.Context, channels ...string) error {
	m.mu.Lock()
	for _, c := range channels {
		m.channels[c] = true
	}
	m.mu.Unlock()
	for _, c := range channels {
		m.put(storekit.Notice{Kind: storekit.Subscribed, Channel: c, Lossless: true})
	}
	return nil
}

func (m *memNotices) Receive(ctx context.Context, timeout time.Duration) (storekit.Notice, error) {
	m.mu.Lock()
	lost := m.overflow
	m.overflow = false
	m.mu.Unlock()
	if lost {
		return storekit.Notice{Kind: storekit.Missed}, nil
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case n := <-m.events:
		return n, nil
	case <-t.C:
		return storekit.Notice{}, storekit.ErrNoNotice
	case <-m.done:
		return storekit.Notice{}, driver.ErrClosed
	case <-ctx.Done():
		return storekit.Notice{}, context.Cause(ctx)
	}
}

func (m *memNotices) InProcess() bool { return true }

func (m *memNotices) Ping(context.Context) error {
	m.put(storekit.Notice{Kind: storekit.Heard})
	return nil
}

func (m *memNotices) Close() error {
	m.once.Do(func() {
		close(m.done)
		m.bus.mu.Lock()
		delete(m.bus.subs, m)
		m.bus.mu.Unlock()
	})
	return nil
}

// ForgetNotices returns the store's forget-notice transport, for dedup's use.
func (s *Store) ForgetNotices() storekit.Bus { return notices{s} }

type notices struct{ s *Store }

func (n notices) Subscribe() storekit.Sub { return n.s.subscribeNotices() }
func (n notices) Subscribers(ctx context.Context, channel string) (int64, error) {
	return n.s.noticeSubscribers(ctx, channel)
}
