package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/internal/testenv"
)

func TestOutageFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-seconds", "0"}, {"-seconds", "-1"}, {"-warm", "-1s"}, {"-window", "0s"}, {"-drain", "0s"},
		{"-workers", "0"}, {"-dup-every", "1"}, {"-dup-every", "-2"}, {"extra"},
	} {
		if _, err := parseOutageFlags(args, new(bytes.Buffer)); err == nil {
			t.Errorf("parseOutageFlags(%q): no error", args)
		}
	}
	cfg, err := parseOutageFlags(nil, new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.redisBin != "redis-server" || cfg.postgres != "" || cfg.seconds != 5 || cfg.warm != 5*time.Second ||
		cfg.window != 5*time.Second || cfg.workers != 8 || cfg.dupEvery != 10 {
		t.Errorf("config %+v", cfg)
	}
	if err := useRedisBin("/bin/sh"); err == nil {
		t.Error("useRedisBin accepted a binary not named redis-server")
	}
}

// `bench outage` in a tiny configuration, on SQLite: the three phases are reported,
// no message is lost and no effect repeated (the markers' promise),
// the verdict is printed (PASS or FAIL on the rates: the library's business, not
// asserted), and the temp dir (the spawned server's and SQLite's) is gone afterwards.
func TestOutageSQLite(t *testing.T) { testOutage(t) }

// The same on PostgreSQL (DEDUP_POSTGRES_URL).
func TestOutagePostgres(t *testing.T) { testOutage(t, "-postgres", testenv.PostgresURL(t)) }

func testOutage(t *testing.T, args ...string) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		testenv.SkipNoServer(t, "redis-server is not on PATH")
	}
	cfg, err := parseOutageFlags(append([]string{"-warm", "300ms", "-window", "700ms", "-seconds", "1", "-workers", "4", "-dup-every", "3"}, args...), new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	cfg.baseDir = t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err = outage(ctx, cfg, &out)
	s := out.String()
	t.Logf("output:\n%s", s)
	if err != nil && !errors.Is(err, errFigureFailed) {
		t.Fatalf("outage: %v", err)
	}
	for _, want := range []string{
		`(?m)^outage: redis-server \S+ spawned at 127\.0\.0\.1:\d+ without persistence`,
		`(?m)^before +\d+\.\d +\d+\.\d +\d+ .*processed=\d+`,
		`(?m)^during +\d+\.\d +\d+\.\d +\d+ `,
		`(?m)^after +\d+\.\d +\d+\.\d +\d+ .*processed=\d+`,
		`(?m)^during/before: \S+ \(bound ≥ 0\.25\)$`,
		`(?m)^keys started \d+; re-runs of committed keys: .*duplicate=\d+`,
		`(?m)^lost 0 \(of which still being retried at the end: 0\); repeated effects 0$`,
		`(?m)^outage: (PASS|FAIL: during/before .*)$`,
	} {
		if !regexp.MustCompile(want).MatchString(s) {
			t.Errorf("no line matching %s", want)
		}
	}
	if (err == nil) != strings.Contains(s, "outage: PASS") {
		t.Errorf("error %v does not match the verdict printed", err)
	}
	if left, _ := os.ReadDir(cfg.baseDir); len(left) > 0 {
		t.Errorf("left behind in the temp dir: %v", left)
	}
}
