package nats

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/keys"
)

// NewJetStream reads the real consumer's config and refuses a retention shorter than
// its redelivery horizon, naming the numbers.
func TestNewJetStreamChecksRetention(t *testing.T) {
	eachServer(t, func(t *testing.T, e *env) {
		e.newStream()
		d := newDeduper(t, memStore(t))
		c := e.consumer("short", func(cc *jetstream.ConsumerConfig) { cc.AckWait = 500 * time.Millisecond; cc.MaxDeliver = 4 })

		_, err := NewJetStream(register(t, d, "short", dedup.WithRetention(time.Second)), c)
		if !errors.Is(err, ErrRetentionTooShort) || !errors.Is(err, dedup.ErrInvalidOption) {
			t.Fatalf("retention 1s on a 2s horizon: %v", err)
		}
		for _, s := range []string{`"short"`, "retention 1s", "AckWait 500ms", "MaxDeliver 4", "BackOff total 0s", "= 2s"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error %q does not name %q", err, s)
			}
		}
		if _, err := NewJetStream(register(t, d, "exact", dedup.WithRetention(2*time.Second)), c); err != nil {
			t.Fatalf("retention equal to the horizon: %v", err)
		}

		// with BackOff, the server may rewrite AckWait: the check reads what it holds
		b := e.consumer("backoff", func(cc *jetstream.ConsumerConfig) {
			cc.AckWait = 0
			cc.MaxDeliver = 4
			cc.BackOff = []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}
		})
		got := b.CachedInfo().Config
		// 3 redeliveries wait 100ms, 200ms, 200ms: the server repeats the last BackOff
		horizon := got.AckWait*time.Duration(got.MaxDeliver) + 500*time.Millisecond
		_, err = NewJetStream(register(t, d, "backoff-short", dedup.WithRetention(horizon-time.Millisecond)), b)
		if !errors.Is(err, ErrRetentionTooShort) || !strings.Contains(err.Error(), "BackOff total 500ms") || !strings.Contains(err.Error(), "= "+horizon.String()) {
			t.Fatalf("retention just under %v: %v", horizon, err)
		}
		if _, err := NewJetStream(register(t, d, "backoff-ok", dedup.WithRetention(horizon)), b); err != nil {
			t.Fatal(err)
		}

		// MaxDeliver unset is unlimited (-1) on the server
		u := e.consumer("unlimited", func(cc *jetstream.ConsumerConfig) { cc.MaxDeliver = 0 })
		hu := register(t, d, "unlimited")
		_, err = NewJetStream(hu, u)
		if !errors.Is(err, dedup.ErrInvalidOption) || errors.Is(err, ErrRetentionTooShort) || !strings.Contains(err.Error(), "MaxDeliver -1") {
			t.Fatalf("unlimited redelivery: %v", err)
		}
		if _, err := NewJetStream(hu, u, WithUnlimitedRedelivery()); err != nil {
			t.Fatalf("unlimited redelivery, accepted: %v", err)
		}
	})
}

func TestRetentionMustCoverTheRedeliveryHorizon(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name      string
		retention time.Duration
		cfg       jetstream.ConsumerConfig
		unlimited bool
		err       error // nil, ErrRetentionTooShort or dedup.ErrInvalidOption
		says      string
	}{
		{"covers", 10 * time.Second, jetstream.ConsumerConfig{AckWait: time.Second, MaxDeliver: 5}, false, nil, ""},
		{"exactly", 5 * time.Second, jetstream.ConsumerConfig{AckWait: time.Second, MaxDeliver: 5}, false, nil, ""},
		{"short", 5*time.Second - ms, jetstream.ConsumerConfig{AckWait: time.Second, MaxDeliver: 5}, false, ErrRetentionTooShort,
			"retention 4.999s < AckWait 1s × MaxDeliver 5 + BackOff total 0s = 5s"},
		// 4 redeliveries wait 1ms, 2ms, 2ms, 2ms: the server repeats the last BackOff value
		{"backoff counts", 5 * time.Second, jetstream.ConsumerConfig{AckWait: time.Second, MaxDeliver: 5, BackOff: []time.Duration{ms, 2 * ms}}, false,
			ErrRetentionTooShort, "BackOff total 7ms = 5.007s"},
		{"backoff covered", 5*time.Second + 7*ms, jetstream.ConsumerConfig{AckWait: time.Second, MaxDeliver: 5, BackOff: []time.Duration{ms, 2 * ms}}, false, nil, ""},
		{"long backoff list repeats its last value", 15 * time.Minute, jetstream.ConsumerConfig{AckWait: time.Second, MaxDeliver: 10, BackOff: []time.Duration{time.Second, 10 * time.Minute}}, false,
			ErrRetentionTooShort, "BackOff total 1h20m1s"},
		{"no overflow", time.Hour, jetstream.ConsumerConfig{AckWait: 30 * time.Second, MaxDeliver: 1_000_000_000}, false, ErrRetentionTooShort, "MaxDeliver 1000000000"},
		{"default AckWait is 30s", 59 * time.Second, jetstream.ConsumerConfig{MaxDeliver: 2}, false, ErrRetentionTooShort, "AckWait 30s × MaxDeliver 2"},
		{"default AckWait covered", time.Minute, jetstream.ConsumerConfig{MaxDeliver: 2}, false, nil, ""},
		{"unlimited", 24 * time.Hour, jetstream.ConsumerConfig{Durable: "c", AckWait: time.Second, MaxDeliver: -1}, false, dedup.ErrInvalidOption, `consumer "c" has MaxDeliver -1`},
		{"unset is unlimited", 24 * time.Hour, jetstream.ConsumerConfig{AckWait: time.Second}, false, dedup.ErrInvalidOption, "MaxDeliver 0"},
		{"unlimited accepted", time.Millisecond, jetstream.ConsumerConfig{AckWait: time.Second, MaxDeliver: -1}, true, nil, ""},
		{"one delivery", time.Second, jetstream.ConsumerConfig{AckWait: time.Second, MaxDeliver: 1}, false, nil, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := CheckRetention(c.retention, c.cfg, c.unlimited)
			if c.err == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, c.err) || !errors.Is(err, dedup.ErrInvalidOption) || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("got %v, want %v saying %q", err, c.err, c.says)
			}
			if c.err == dedup.ErrInvalidOption && errors.Is(err, ErrRetentionTooShort) {
				t.Fatalf("unlimited redelivery is not a short retention: %v", err)
			}
		})
	}
}

func TestInvalidOptionsAreErrInvalidOption(t *testing.T) {
	h := register(t, newDeduper(t, memStore(t)), "orders")
	c := consumerWith(time.Second, 5)
	bad := map[string]Option{
		"nil option":         nil,
		"nil backoff":        WithBackoff(nil),
		"nil exhausted":      WithExhausted(nil),
		"zero store retry":   WithStoreRetryDelay(0),
		"negative progress":  WithProgressEvery(-time.Second),
		"max deliver 0":      WithMaxDeliver(0),
		"max deliver -2":     WithMaxDeliver(-2),
		"nil key strategy":   WithKeyStrategy(nil),
		"invalid strategy":   WithKeyStrategy(keys.Header("")),
		"nil logger":         WithLogger(nil),
		"invalid in firstof": WithKeyStrategy(keys.FirstOf(keys.Header("a"), keys.Header(""))),
	}
	for name, o := range bad {
		if _, err := NewJetStream(h, c, o); !errors.Is(err, dedup.ErrInvalidOption) {
			t.Errorf("NewJetStream, %s: %v", name, err)
		}
		if _, err := NewCore(h, o); !errors.Is(err, dedup.ErrInvalidOption) {
			t.Errorf("NewCore, %s: %v", name, err)
		}
	}
	if _, err := NewJetStream(nil, c); !errors.Is(err, dedup.ErrInvalidOption) {
		t.Errorf("nil handler: %v", err)
	}
	if _, err := NewCore(nil); !errors.Is(err, dedup.ErrInvalidOption) {
		t.Errorf("core, nil handler: %v", err)
	}
	if _, err := NewJetStream(h, nil); !errors.Is(err, dedup.ErrInvalidOption) {
		t.Errorf("nil consumer: %v", err)
	}
	if _, err := NewJetStream(h, fakeConsumer{}); !errors.Is(err, dedup.ErrInvalidOption) {
		t.Errorf("consumer without info: %v", err)
	}
	if _, err := NewCore(h, WithMaxDeliver(-1), WithMaxDeliver(3), WithDoubleAck(true), WithProgressEvery(time.Second)); err != nil {
		t.Errorf("good options: %v", err)
	}
}

func TestDefaultBackoffDoublesFromASecondUpToAMinute(t *testing.T) {
	for n, want := range map[uint64]time.Duration{
		0: time.Second, 1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 6: 32 * time.Second,
		7: time.Minute, 8: time.Minute, 1 << 40: time.Minute,
	} {
		if got := DefaultBackoff(n); got != want {
			t.Errorf("DefaultBackoff(%d) = %v, want %v", n, got, want)
		}
	}
}

func TestActionsPrintTheirNames(t *testing.T) {
	want := map[Action]string{ActNone: "none", ActAck: "ack", ActDoubleAck: "double-ack", ActNak: "nak",
		ActNakWithDelay: "nak-with-delay", ActTerm: "term", numActions: "invalid"}
	for a, s := range want {
		if a.String() != s {
			t.Errorf("%d: %q, want %q", a, a.String(), s)
		}
	}
	var s Stats
	if s.Count(numActions) != 0 {
		t.Fatal("count of an invalid action")
	}
}
