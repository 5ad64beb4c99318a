package nats

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedupkit/dedup"
)

// Regression tests from the second review: each failed before its fix.

// AckAll would let a later Ack confirm an earlier Nak'ed message; AckNone cannot
// redeliver. Only explicit acks are accepted.
func TestNewJetStreamNeedsExplicitAcks(t *testing.T) {
	h := register(t, newDeduper(t, memStore(t)), "orders", dedup.WithRetention(time.Hour))
	for _, p := range []jetstream.AckPolicy{jetstream.AckAllPolicy, jetstream.AckNonePolicy} {
		c := consumerWith(time.Second, 5)
		c.info.Config.AckPolicy = p
		_, err := NewJetStream(h, c)
		if !errors.Is(err, dedup.ErrInvalidOption) || !strings.Contains(err.Error(), "AckExplicitPolicy") {
			t.Errorf("ack policy %v: %v", p, err)
		}
	}
	if _, err := NewJetStream(h, consumerWith(time.Second, 5)); err != nil {
		t.Fatalf("explicit acks: %v", err)
	}
}

// A handler that ends its goroutine (runtime.Goexit, as t.FailNow does) must not
// leave its message signalled in progress forever; the message is Nak'ed, as after a
// panic, rather than left for AckWait.
func TestProgressStopsWhenHandlerExits(t *testing.T) {
	h := register(t, newDeduper(t, memStore(t)), "orders", dedup.WithRetention(time.Hour))
	a, err := NewJetStream(h, consumerWith(time.Second, 5), WithProgressEvery(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	msg := newFake("order-1", "a", 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.Handle(context.Background(), msg, func(context.Context, *Msg) error {
			// a few signals while it runs: waited for, as a loaded machine can hold the
			// 10ms timer up past any fixed sleep (35ms once saw none)
			for deadline := time.Now().Add(10 * time.Second); msg.progress.Load() < 3; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Error("no in-progress signals within 10s")
					break
				}
			}
			runtime.Goexit()
			return nil
		})
	}()
	<-done
	before := msg.progress.Load()
	time.Sleep(100 * time.Millisecond)
	if after := msg.progress.Load(); after != before || before == 0 {
		t.Fatalf("in-progress signals %d while running, %d after the handler exited", before, after-before)
	}
	msg.mu.Lock()
	defer msg.mu.Unlock()
	if len(msg.acks) != 1 || msg.acks[0] != "nak" {
		t.Fatalf("acks %q, want one nak", msg.acks)
	}
}
