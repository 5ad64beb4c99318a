package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/internal/testenv"
)

// soakChildEnv carries a consumer's arguments (JSON) to TestSoakConsumerChild: under
// go test, the soak's consumer processes are this test binary run again.
const soakChildEnv = "DEDUPKIT_SOAK_CONSUMER"

// TestSoakConsumerChild is a soak consumer process; run as a test of its own it does
// nothing.
func TestSoakConsumerChild(t *testing.T) {
	raw := os.Getenv(soakChildEnv)
	if raw == "" {
		return
	}
	var args []string
	if err := json.Unmarshal([]byte(raw), &args); err != nil {
		t.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := runSoakConsumer(ctx, args, os.Stderr); err != nil {
		t.Fatal(err)
	}
}

// TestSoak runs the chaos soak with 2000 messages and 3 consumer processes (this
// test binary again), with every fault, and checks its JSON line, and that it left
// no process running and no file behind.
func TestSoak(t *testing.T) {
	rep, num := runSoakTest(t, "-messages", "2000", "-timeout", "3m")
	for k, want := range map[string]float64{
		"messages": 2000, "lost": 0, "duplicate_successes": 0, "phantom_successes": 0,
		"consumer_kills": 2, "redis_restarts": 1, "consumer_exits": 0, "exhausted": 0,
	} {
		if got := num(k); got != want {
			t.Errorf("%s = %v, want %v", k, got, want)
		}
	}
	if d := num("deliveries"); d < 2000+num("naks_injected") {
		t.Errorf("deliveries %v: fewer than the messages and the injected naks", d)
	}
	for _, k := range []string{"naks_injected", "acks_dropped", "store_unavailable", "redis_down_s", "duration_s"} {
		if num(k) <= 0 {
			t.Errorf("%s = %v, want some", k, num(k))
		}
	}
	// each kill: what the process had in hand, and what it left uncommitted
	kills, _ := rep["kills"].([]any)
	if len(kills) != 2 {
		t.Fatalf("kills %v, want 2", rep["kills"])
	}
	left := 0.0
	for _, k := range kills {
		m, _ := k.(map[string]any)
		pid, _ := m["pid"].(float64)
		inHand, _ := m["handlers_in_flight"].(float64)
		fx, ok1 := m["effects_in_flight"].(float64)
		un, ok2 := m["uncommitted_effects"].(float64)
		if pid <= 0 || !ok1 || !ok2 || fx > inHand {
			t.Errorf("kill %v: want a pid, and effects in flight among the handlers in flight", m)
		}
		if un > fx {
			t.Errorf("kill %v: more uncommitted effects than effects in flight at the kill", m)
		}
		left += un
	}
	if left > num("uncommitted_effects") {
		t.Errorf("the kills left %v uncommitted effects, more than the %v in all", left, num("uncommitted_effects"))
	}
}

// TestSoakTx runs the transactional variant with 10 000 messages: the effects are
// rows committed in PostgreSQL with their markers, while consumers are SIGKILLed and
// the dedup Redis, which keeps nothing on disk, is killed and restarted (every record
// lost), which the runs do not wait for. Each message's row must be there exactly once.
func TestSoakTx(t *testing.T) {
	testenv.PostgresURL(t)
	// 3 000 messages: CI's own step soaks 20 000 (.ci/run)
	rep, num := runSoakTest(t, "-tx", "-messages", "3000", "-timeout", "3m")
	for k, want := range map[string]float64{
		"messages": 3000, "lost": 0, "effects_repeated": 0,
		"consumer_kills": 2, "redis_restarts": 1, "consumer_exits": 0, "exhausted": 0,
	} {
		if got := num(k); got != want {
			t.Errorf("%s = %v, want %v", k, got, want)
		}
	}
	if rep["mode"] != "tx" {
		t.Errorf("mode %v, want tx", rep["mode"])
	}
	if _, ok := rep["uncommitted_effects"]; ok {
		t.Errorf("uncommitted_effects reported for the tx variant, where a row is committed or absent")
	}
	for _, k := range []string{"naks_injected", "acks_dropped", "redis_down_s"} {
		if num(k) <= 0 {
			t.Errorf("%s = %v, want some", k, num(k))
		}
	}
	// a transactional run claims nothing: Redis down, it goes on with its marker
	if num("store_unavailable") != 0 {
		t.Errorf("store_unavailable = %v with the dedup Redis down, want 0", num("store_unavailable"))
	}
	t.Logf("duplicates answered by the markers: %v", num("database_duplicates"))
}

// runSoakTest runs the soak with args (consumer processes: this test binary again)
// and checks that it passed and left no process running and no file behind. It
// returns its JSON line, and a reader of its numbers.
func runSoakTest(t *testing.T, args ...string) (map[string]any, func(k string) float64) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		testenv.SkipNoServer(t, "redis-server is not on PATH")
	}
	base := t.TempDir()
	var mu sync.Mutex
	var cmds []*exec.Cmd
	cfg, err := parseSoakFlags(args, new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	cfg.baseDir = base
	cfg.command = func(args []string) (*exec.Cmd, error) {
		raw, err := json.Marshal(args)
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestSoakConsumerChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), soakChildEnv+"="+string(raw))
		mu.Lock()
		cmds = append(cmds, cmd)
		mu.Unlock()
		return cmd, nil
	}
	var stdout, stderr bytes.Buffer
	err = soak(context.Background(), cfg, &stdout, &stderr)
	t.Logf("seed %d; stdout:\n%s", cfg.seed, stdout.String())
	if err != nil {
		t.Fatalf("soak: %v\nstderr:\n%s", err, stderr.String())
	}

	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var rep map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &rep); err != nil {
		t.Fatalf("last line is not JSON: %v", err)
	}
	num := func(k string) float64 {
		v, ok := rep[k].(float64)
		if !ok {
			t.Fatalf("%s missing from the JSON or not a number: %v", k, rep[k])
		}
		return v
	}
	if rep["ok"] != true {
		t.Errorf("ok = %v", rep["ok"])
	}
	mu.Lock()
	defer mu.Unlock()
	if len(cmds) != 3+2 {
		t.Errorf("%d consumer processes started, want 3 and 2 replacements", len(cmds))
	}
	for _, c := range cmds {
		if c.ProcessState == nil {
			t.Errorf("consumer pid %d was never reaped", c.Process.Pid)
		}
	}
	if left, _ := os.ReadDir(base); len(left) > 0 {
		t.Errorf("left behind in the temp dir: %v", left)
	}
	return rep, num
}

// The tally over hand-made ledgers: each case is one message.
func TestSoakTally(t *testing.T) {
	cases := []struct {
		name             string
		effects, commits []string
		done             string
		want             soakTally
		notRecorded      []string
	}{
		{"processed once", []string{"a"}, []string{"a"}, "a", soakTally{}, nil},
		{"killed between completing and the commit", []string{"a"}, nil, "a", soakTally{}, nil},
		{"NotRecorded, acked", []string{"a"}, []string{"a"}, "", soakTally{}, nil},
		{"killed before completing, run again", []string{"k", "b"}, []string{"b"}, "b", soakTally{Uncommitted: 1}, nil},
		{"ran twice, both committed", []string{"a", "b"}, []string{"a", "b"}, "b", soakTally{DuplicateSuccesses: 1}, nil},
		{"record lost, run again", []string{"a", "b"}, []string{"a"}, "b", soakTally{DuplicateSuccesses: 1}, nil},
		{"three successes", []string{"a", "b", "c"}, []string{"a", "c"}, "b", soakTally{DuplicateSuccesses: 2}, nil},
		{"never ran", nil, nil, "", soakTally{Lost: 1}, nil},
		{"only a killed run", []string{"k"}, nil, "", soakTally{Lost: 1, Uncommitted: 1}, nil},
		{"DONE without the effect", nil, nil, "x", soakTally{Lost: 1, Phantoms: 1}, nil},
		{"commit without the effect", []string{"k"}, []string{"x"}, "", soakTally{Lost: 1, Phantoms: 1, Uncommitted: 1}, nil},
		{"a phantom next to a success", []string{"a"}, []string{"a", "x"}, "a", soakTally{Phantoms: 1}, nil},
		// NotRecorded, its ack lost with a killed consumer, run again: the README's window
		{"NotRecorded, then run again", []string{"a", "b"}, []string{"a", "b"}, "b", soakTally{NotRecordedRepeats: 1}, []string{"a"}},
		{"NotRecorded explains one repeat, not two", []string{"a", "b", "c"}, []string{"a", "b", "c"}, "c",
			soakTally{NotRecordedRepeats: 1, DuplicateSuccesses: 1}, []string{"a"}},
	}
	var all ledgerState
	var sum soakTally
	for _, c := range cases {
		l := ledgerState{effects: [][]string{c.effects}, commits: [][]string{c.commits},
			notRecorded: [][]string{c.notRecorded}, done: []string{c.done}}
		if got := l.count(1); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
		all.effects = append(all.effects, c.effects)
		all.commits = append(all.commits, c.commits)
		all.notRecorded = append(all.notRecorded, c.notRecorded)
		all.done = append(all.done, c.done)
		sum.Lost += c.want.Lost
		sum.DuplicateSuccesses += c.want.DuplicateSuccesses
		sum.NotRecordedRepeats += c.want.NotRecordedRepeats
		sum.Phantoms += c.want.Phantoms
		sum.Uncommitted += c.want.Uncommitted
	}
	if got := all.count(len(cases)); got != sum {
		t.Errorf("all cases at once: %+v, want %+v", got, sum)
	}
	// messages the ledger knows nothing of are lost
	if got := all.count(len(cases) + 2); got.Lost != sum.Lost+2 {
		t.Errorf("two messages beyond the ledger: lost %d, want %d", got.Lost, sum.Lost+2)
	}
}

func TestSoakNames(t *testing.T) {
	for v, want := range map[string]string{"d:tok:fp": "tok", "d:tok:": "tok", "p:tok:": "", "": "", "dtok": "", "x:tok:fp": ""} {
		if got := doneToken(v); got != want {
			t.Errorf("doneToken(%q) = %q, want %q", v, got, want)
		}
	}
	for id, want := range map[string]int{"soak-0": 0, "soak-123": 123, "soak--1": -1, "soak-": -1, "other-1": -1, "1": -1} {
		if got := soakIndex(id); got != want {
			t.Errorf("soakIndex(%q) = %d, want %d", id, got, want)
		}
	}
	if got := recordIndex("dksoak-1a2b:soak:" + soakMsgID(42)); got != 42 {
		t.Errorf("recordIndex = %d, want 42", got)
	}
}

// The verdict fails a soak for each thing the JSON must not show.
func TestSoakVerdict(t *testing.T) {
	cfg, err := parseSoakFlags(nil, new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	good := func() *soakReport {
		return &soakReport{Messages: 10, ConsumerKills: 2, RedisRestarts: 1, NaksInjected: 1, AcksDropped: 1}
	}
	if err := good().verdict(cfg); err != nil {
		t.Fatalf("a clean report: %v", err)
	}
	for name, spoil := range map[string]func(r *soakReport){
		"lost":        func(r *soakReport) { r.Lost = 1 },
		"duplicate":   func(r *soakReport) { r.DuplicateSuccesses = 1 },
		"phantom":     func(r *soakReport) { r.PhantomSuccesses = 1 },
		"one kill":    func(r *soakReport) { r.ConsumerKills = 1 },
		"no restart":  func(r *soakReport) { r.RedisRestarts = 0 },
		"no naks":     func(r *soakReport) { r.NaksInjected = 0 },
		"no drops":    func(r *soakReport) { r.AcksDropped = 0 },
		"an exit":     func(r *soakReport) { r.ConsumerExits = 1 },
		"timed out":   func(r *soakReport) { r.TimedOut, r.Error = true, "timed out after 5m0s" },
		"other error": func(r *soakReport) { r.Error = "ledger: broken" },
	} {
		r := good()
		spoil(r)
		if err := r.verdict(cfg); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestSoakFlags(t *testing.T) {
	cfg, err := parseSoakFlags(nil, new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.messages != 100_000 || cfg.consumers != 3 || cfg.timeout != 5*time.Minute ||
		cfg.kills != 2 || cfg.restarts != 1 || cfg.nakRate != 0.05 || cfg.dropRate != 0.01 || cfg.seed == 0 {
		t.Errorf("defaults %+v", cfg)
	}
	for _, args := range [][]string{
		{"-messages", "0"}, {"-consumers", "0"}, {"-timeout", "0s"}, {"-concurrency", "0"},
		{"-kills", "-1"}, {"-nak-rate", "1"}, {"-drop-rate", "-0.1"}, {"-redis-down", "-1s"}, {"extra"},
	} {
		if _, err := parseSoakFlags(args, new(bytes.Buffer)); err == nil {
			t.Errorf("parseSoakFlags(%q): no error", args)
		}
	}
	cc := consumerConfig{natsURL: "nats://x", redisAddr: "r", ledgerAddr: "l", stream: "S", durable: "d", prefix: "p",
		concurrency: 7, buffer: 9, lease: time.Second, retention: time.Hour, nakRate: 0.5, dropRate: 0.25, verbose: true}
	back, err := parseConsumerFlags(cc.args(), new(bytes.Buffer))
	if err != nil || back != cc {
		t.Errorf("consumer flags round trip: %+v, %v; want %+v", back, err, cc)
	}
	if _, err := parseConsumerFlags([]string{"-nats", "x"}, new(bytes.Buffer)); err == nil {
		t.Error("a consumer without its servers: no error")
	}
}

// run dispatches the soak's subcommands: their own flags, not the benchmark's.
func TestSoakSubcommand(t *testing.T) {
	err := run(context.Background(), []string{"soak", "-messages", "0"}, new(bytes.Buffer))
	if err == nil || !strings.Contains(err.Error(), "-messages 0 is outside") {
		t.Errorf("soak -messages 0: %v, want the soak's flag error", err)
	}
	err = run(context.Background(), []string{"soak-consumer", "-nats", "x"}, new(bytes.Buffer))
	if err == nil || !strings.Contains(err.Error(), "are required") {
		t.Errorf("soak-consumer without servers: %v, want the consumer's flag error", err)
	}
}

// A killed process's uncommitted effects are its runs with a side effect that never
// became successful: not committed, and not the token of the message's DONE record.
func TestSoakUncommittedOfAKill(t *testing.T) {
	l := ledgerState{commits: [][]string{{"a"}, nil, nil}, done: []string{"", "b", ""}}
	runs := []string{runName(0, "a"), runName(1, "b"), runName(2, "c"), runName(0, "k")}
	if got := l.uncommitted(runs); got != 2 {
		t.Errorf("uncommitted(%v) = %d, want 2 (0:k and 2:c)", runs, got)
	}
	for _, bad := range []string{"", "x:tok", "-1:tok", "3:", "3"} {
		if _, _, ok := parseRunName(bad); ok {
			t.Errorf("parseRunName(%q) ok", bad)
		}
	}
	if i, tok, ok := parseRunName(runName(12, "t:k")); !ok || i != 12 || tok != "t:k" {
		t.Errorf("round trip: %d %q %v", i, tok, ok)
	}
}
