package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestStallFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-runs", "0"}, {"-messages", "0"}, {"-concurrency", "0"}, {"-concurrency", "4097"},
		{"-max-ack-pending", "0"}, {"-heartbeat", "100ms"}, {"-heartbeat", "16s"},
		{"-ack", "sync"}, {"-ack-delay", "-1ms"}, {"-timeout", "0s"}, {"extra"},
	} {
		if _, err := parseStallFlags(args, new(bytes.Buffer)); err == nil {
			t.Errorf("parseStallFlags(%q): no error", args)
		}
	}
	cfg, err := parseStallFlags([]string{"-heartbeat", "1s", "-ack", "timer"}, new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.heartbeat != time.Second || cfg.ack != "timer" || cfg.runs != 40 || cfg.concurrency != 1024 || cfg.maxAckPending != 1000 {
		t.Errorf("config %+v", cfg)
	}
}

// `bench stall` on embedded servers, both ways of acking: every run reads the whole
// stream, and the total counts the runs.
func TestStallEmbedded(t *testing.T) {
	for _, ack := range []string{"adapter", "timer"} {
		t.Run(ack, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var out bytes.Buffer
			err := run(ctx, []string{"stall", "-runs", "2", "-messages", "300", "-ack", ack, "-heartbeat", "1s"}, &out)
			if err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			s := out.String()
			if !strings.Contains(s, "-ack "+ack) {
				t.Errorf("header does not name -ack %s:\n%s", ack, s)
			}
			if n := len(regexp.MustCompile(`(?m)^run \d+: `).FindAllString(s, -1)); n != 2 {
				t.Errorf("%d run lines, want 2:\n%s", n, s)
			}
			if !regexp.MustCompile(`(?m)^stalls: \d+ of 2 runs$`).MatchString(s) {
				t.Errorf("no total line:\n%s", s)
			}
		})
	}
}
