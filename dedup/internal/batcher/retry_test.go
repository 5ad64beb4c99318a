package batcher

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
)

// downStore fails every call until up; then Complete behaves as onComplete says.
type downStore struct {
	up         atomic.Bool
	landed     atomic.Int32 // completions written
	onComplete func() error // after up: nil writes; may block
}

var errDown = fmt.Errorf("%w: connection refused", driver.ErrStoreUnavailable)

func (s *downStore) Claim(context.Context, []driver.Entry) ([]driver.Answer, error) {
	return nil, errDown
}
func (s *downStore) Mark(context.Context, []driver.Entry) ([]driver.Answer, error) {
	return nil, errDown
}
func (s *downStore) Complete(_ context.Context, es []driver.Entry) ([]error, error) {
	if !s.up.Load() {
		return nil, errDown
	}
	if err := s.onComplete(); err != nil {
		return nil, err
	}
	s.landed.Add(int32(len(es)))
	return make([]error, len(es)), nil
}
func (s *downStore) Extend(_ context.Context, es []driver.Entry) ([]error, error) {
	return make([]error, len(es)), nil
}
func (s *downStore) Release(_ context.Context, es []driver.Entry) ([]error, error) {
	return make([]error, len(es)), nil
}

// downGuard guards s with its breaker open (s is down) and one completion failed,
// to retry; the probe's Ping brings s up. It returns the guard and its Close.
func downGuard(t *testing.T, s *downStore) (*Store, func()) {
	t.Helper()
	closing, cancel := context.WithCancel(context.Background())
	abandon := make(chan struct{})
	g := New(s, Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Closing: closing, Abandon: abandon,
		Ping: func(context.Context) error { s.up.Store(true); return nil }})
	for range BreakerTrip {
		_, _ = g.Claim(context.Background(), []driver.Entry{{Key: "c", Token: "t", TTL: time.Minute}})
	}
	ctx, stop := context.WithTimeout(context.Background(), time.Minute) // a run's: its lease
	defer stop()
	if _, err := g.Complete(ctx, []driver.Entry{{Key: "k", Token: "t", TTL: time.Minute}}); err == nil {
		t.Fatal("a completion on a store down succeeded")
	}
	return g, func() { cancel(); close(abandon); g.Wait() }
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// A retried completion whose store call never returns (a client that ignores its
// context) holds neither the breaker's probe, which closes the breaker, nor Close.
func TestARetryTheStoreNeverAnswersHoldsNeitherTheProbeNorClose(t *testing.T) {
	hang := make(chan struct{})
	defer close(hang)
	var hung atomic.Int32
	s := &downStore{onComplete: func() error { hung.Add(1); <-hang; return errDown }}
	g, closeG := downGuard(t, s)
	eventually(t, "the breaker to close once the store answers pings", func() bool { return !g.Open() })
	eventually(t, "a retry to hang", func() bool { return hung.Load() > 0 })
	closed := make(chan struct{})
	go func() { closeG(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waits for a retried completion the store never answers")
	}
}

// A completion the probe sent again, which failed again, is retried afterwards,
// though the goroutine that retries ended meanwhile (it found nothing pending while
// the probe held it).
func TestAProbesRetryThatFailsIsRetriedAgain(t *testing.T) {
	var calls atomic.Int32
	s := &downStore{onComplete: func() error {
		if calls.Add(1) == 1 { // the first send once the store is up, the probe's: slow, then failing
			time.Sleep(1500 * time.Millisecond)
			return errDown
		}
		return nil
	}}
	g, closeG := downGuard(t, s)
	defer closeG()
	eventually(t, "the completion to land", func() bool { return s.landed.Load() == 1 })
	if g.Open() {
		t.Fatal("breaker still open")
	}
}
