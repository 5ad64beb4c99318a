package dedup

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/dedupkit/dedupkit/keys"
)

// Lookup implements RecordStore.
func (s *MemoryStore) Lookup(ctx context.Context, keys []string) ([]Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	out := make([]Record, len(keys))
	for i, k := range keys {
		out[i] = s.record(k, now)
	}
	return out, nil
}

// record returns what key holds. Callers hold mu.
func (s *MemoryStore) record(key string, now time.Time) Record {
	r, ok := s.get(key, now)
	if !ok {
		return Record{}
	}
	rec := Record{State: RecordDone, Owner: r.token, Fingerprint: r.fp, TTL: r.expires.Sub(now)}
	if r.state == stateInProgress {
		rec.State = RecordInProgress
	}
	if r.hasReply {
		rec.ReplySize, rec.HasReply, rec.reply = len(r.reply), true, r.reply
	}
	return rec
}

// Forget implements RecordStore. The forget notices reach the Dedupers subscribed
// to this store (every Deduper built on it that runs the record's handler with a
// local tier) before Forget returns, unless a subscriber's queue of notices is full:
// that one drops its handlers' local tiers instead.
func (s *MemoryStore) Forget(ctx context.Context, keys []string, force bool) ([]Record, error) {
	for _, k := range keys {
		if _, _, ok := splitRecordKey(k); !ok {
			return nil, fmt.Errorf("%w: %q is not a record key (<prefix>:<handler>:<key>)", ErrInvalidOption, k)
		}
	}
	out := make([]Record, len(keys))
	s.mu.Lock()
	now := s.now()
	for i, k := range keys {
		out[i] = s.record(k, now)
		if out[i].State == RecordInProgress && !force {
			out[i].Err = inProgressErr(out[i])
			continue
		}
		delete(s.recs, k)
	}
	s.mu.Unlock()
	for i, k := range keys {
		if out[i].Err == nil {
			channel, mk, _ := splitRecordKey(k)
			out[i].Notified = s.bus.publish(channel, mk)
		}
	}
	return out, nil
}

// CountRecords implements RecordStore: the live records under prefix, by handler.
func (s *MemoryStore) CountRecords(ctx context.Context, prefix, handler string) (map[string]int64, error) {
	if err := keys.ValidatePrefix(prefix); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	if handler != "" {
		if err := validName(handler); err != nil {
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
		if name, ok := handlerOf(k, prefix); ok && (handler == "" || name == handler) {
			counts[name]++
		}
	}
	return counts, nil
}

// subscribeNotices implements noticeBus: a subscription in this process.
func (s *MemoryStore) subscribeNotices() noticeSub {
	sub := &memNotices{bus: &s.bus, events: make(chan notice, memNoticeQueue), done: make(chan struct{}), channels: make(map[string]bool)}
	s.bus.mu.Lock()
	if s.bus.subs == nil {
		s.bus.subs = make(map[*memNotices]struct{})
	}
	s.bus.subs[sub] = struct{}{}
	s.bus.mu.Unlock()
	return sub
}

// noticeSubscribers implements noticeBus.
func (s *MemoryStore) noticeSubscribers(_ context.Context, channel string) (int64, error) {
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

// memNoticeQueue bounds the notices waiting for one subscriber of a MemoryStore.
const memNoticeQueue = 1024

// memBus carries a MemoryStore's forget notices to its subscribers.
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
			sub.put(notice{kind: noticeForgotten, channel: channel, k: k})
			n++
		}
	}
	return n
}

// memNotices is a subscription to a MemoryStore's notices: a bounded queue. A
// subscriber that falls a whole queue behind loses notices, and is told so
// (noticeMissed) by its next receive.
type memNotices struct {
	bus    *memBus
	events chan notice
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

func (m *memNotices) put(n notice) {
	select {
	case m.events <- n:
	default:
		m.mu.Lock()
		m.overflow = true
		m.mu.Unlock()
	}
}

func (m *memNotices) add(_ context.Context, channels ...string) error {
	m.mu.Lock()
	for _, c := range channels {
		m.channels[c] = true
	}
	m.mu.Unlock()
	for _, c := range channels {
		m.put(notice{kind: noticeSubscribed, channel: c, lossless: true})
	}
	return nil
}

func (m *memNotices) receive(ctx context.Context, timeout time.Duration) (notice, error) {
	m.mu.Lock()
	lost := m.overflow
	m.overflow = false
	m.mu.Unlock()
	if lost {
		return notice{kind: noticeMissed}, nil
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case n := <-m.events:
		return n, nil
	case <-t.C:
		return notice{}, errNoticeTimeout
	case <-m.done:
		return notice{}, ErrClosed
	case <-ctx.Done():
		return notice{}, context.Cause(ctx)
	}
}

func (m *memNotices) ping(context.Context) error {
	m.put(notice{kind: noticeHeard})
	return nil
}

func (m *memNotices) close() error {
	m.once.Do(func() {
		close(m.done)
		m.bus.mu.Lock()
		delete(m.bus.subs, m)
		m.bus.mu.Unlock()
	})
	return nil
}
