package main

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedupkit/internal/embedded"
)

func TestCopiesFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-orders", "0"}, {"-orders", "1000001"}, {"-key-header", ""}, {"-key-header", "a b"},
		{"-key-header", "a:b"}, {"-work", "-1ms"}, {"-timeout", "0s"}, {"extra"},
	} {
		if _, err := parseCopiesFlags(args, new(bytes.Buffer)); err == nil {
			t.Errorf("parseCopiesFlags(%q): no error", args)
		}
	}
	cfg, err := parseCopiesFlags([]string{"-nats", "nats://x:1", "-redis", "x:2"}, new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.orders != 1000 || cfg.keyHeader != "Idempotency-Key" || cfg.work != 2*time.Millisecond ||
		cfg.timeout != 2*time.Minute || cfg.natsURL != "nats://x:1" || cfg.redisAddr != "x:2" {
		t.Errorf("config %+v", cfg)
	}
}

// `bench copies` on a miniredis and an in-process NATS server of the test's own, with
// a few orders: both phases are reported, every order ran, the verdict is printed
// (PASS or FAIL: which one is the library's business, and the drain times are not
// asserted), and the servers hold no key and no stream afterwards.
func TestCopiesEmbedded(t *testing.T) {
	mr := miniredis.RunT(t)
	ns, err := embedded.StartNATS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Close)
	cfg, err := parseCopiesFlags([]string{"-orders", "30", "-timeout", "90s"}, new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err = copies(ctx, cfg, servers{redisAddr: mr.Addr(), natsURL: ns.URL()}, &out)
	s := out.String()
	t.Logf("output:\n%s", s)
	if err != nil && !errors.Is(err, errFigureFailed) {
		t.Fatalf("copies: %v", err)
	}
	for _, want := range []string{
		`(?m)^once: +30 published, 30 stored; drained in \d+\.\d+ s$`,
		`(?m)^copies: 60 published, 60 stored; drained in \d+\.\d+ s$`,
		`(?m)^ +fn runs \d+ for 30 orders: ran more than once \d+ \(\d+ extra runs\), never ran 0$`,
		`(?m)^copies/once: .* = \d+\.\d+×; bound 3 × once \+ 2s = \d+\.\d+ s$`,
		`(?m)^repeated \(orders run more than once\): \d+; never ran: 0$`,
		`(?m)^copies: (PASS|FAIL: .*)$`,
	} {
		if !regexp.MustCompile(want).MatchString(s) {
			t.Errorf("no line matching %s", want)
		}
	}
	if n := len(regexp.MustCompile(`(?m)never ran 0$`).FindAllString(s, -1)); n != 2 {
		t.Errorf("%d phases in which every order ran, want 2", n)
	}
	if (err == nil) != strings.Contains(s, "copies: PASS") {
		t.Errorf("error %v does not match the verdict printed", err)
	}

	if keys := mr.Keys(); len(keys) > 0 {
		t.Errorf("keys left in Redis: %v", keys)
	}
	nc, err := natsgo.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for name := range js.StreamNames(ctx).Name() {
		t.Errorf("stream left: %s", name)
	}
}
