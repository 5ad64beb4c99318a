package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/exec"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/embedded"
)

// retention is the TTL of every record and naive key the run writes: long enough for
// the run, short enough that a run killed before its clean-up leaves nothing for long.
const retention = 10 * time.Minute

// bench is one run: its servers, clients, names and results.
type bench struct {
	cfg     config
	srv     servers
	out     io.Writer
	id      string // random; names the run's key prefix and stream
	rev     string // the code measured: revision()
	prefix  string // every Redis key the run writes starts with prefix + ":"
	started time.Time

	// storeRDB carries the library's commands; plainRDB the naive, direct and ceiling
	// ones, and the clean-up. Both have go-redis's defaults but ContextTimeoutEnabled.
	storeRDB, plainRDB *redis.Client
	rue                rueidis.Client       // the rueidis-* reference variants of scenario b
	goAuto             *redis.AutoPipeliner // scenario b's goredis-auto-setnx, on a client of its own
	dd                 *dedup.Deduper       // the Redis-backed Deduper of scenarios b, c, d
	// ddGoAuto is dd's store over go-redis's AutoPipeline in place of a plain client
	// (scenario b's *-goredis-ap variants, issue 27 point 4)
	ddGoAuto *dedup.Deduper

	local localState // scenario a
	store storeState // scenario b
	zipf  zipfState  // scenario c
	js    jsState    // scenario d
	tx    txState    // scenario e

	res     *results
	notes   []string // what was skipped or noticed, and why
	closers []func() error
}

// scenario is one of a, b, c, d: setup runs once before the first round, round once
// per round.
type scenario struct {
	letter, title string
	setup         func(ctx context.Context) error
	round         func(ctx context.Context, r int) error
}

// runBench runs the selected scenarios on srv for cfg.rounds rounds, prints the
// tables, writes -json and -svg, and deletes every key and stream it made, also when
// it fails.
func runBench(ctx context.Context, cfg config, srv servers, out io.Writer) (err error) {
	b := &bench{cfg: cfg, srv: srv, out: out, id: runID(), rev: revision(), started: time.Now()}
	b.prefix = "dkbench-" + b.id
	b.res = newResults(cfg.rounds)
	defer func() { err = errors.Join(err, b.close()) }()

	b.printHeader()
	if err := b.connect(ctx); err != nil {
		return err
	}
	setBenchtime(cfg.duration)

	var scs []scenario
	for _, l := range scenarioLetters {
		if l == "e" && cfg.only[l] && cfg.postgres == "" {
			b.note("e (transactional marker) skipped: no -postgres (or DEDUP_POSTGRES_URL)")
			continue
		}
		if cfg.only[l] {
			scs = append(scs, b.scenario(l))
		}
	}
	for _, sc := range scs {
		if err := sc.setup(ctx); err != nil {
			return fmt.Errorf("scenario %s setup: %w", sc.letter, err)
		}
	}
	for r := range cfg.rounds {
		fmt.Fprintf(out, "round %d/%d:", r+1, cfg.rounds)
		t0 := time.Now()
		for _, sc := range scs {
			fmt.Fprintf(out, " %s", sc.letter)
			if err := sc.round(ctx, r); err != nil {
				fmt.Fprintln(out)
				return fmt.Errorf("round %d, scenario %s (%s): %w", r+1, sc.letter, sc.title, err)
			}
		}
		fmt.Fprintf(out, " (%.1fs)\n", time.Since(t0).Seconds())
	}
	return b.report()
}

func (b *bench) scenario(letter string) scenario {
	switch letter {
	case "a":
		return scenario{letter, "local tier", b.setupLocal, b.roundLocal}
	case "b":
		return scenario{letter, "unique keys", b.setupStore, b.roundStore}
	case "c":
		return scenario{letter, "Zipf mix", b.setupZipf, b.roundZipf}
	case "e":
		return scenario{letter, "transactional marker", b.setupTx, b.roundTx}
	default:
		return scenario{letter, "JetStream", b.setupJetStream, b.roundJetStream}
	}
}

// setBenchtime makes testing.Benchmark (scenario a) run for d instead of its 1s.
func setBenchtime(d time.Duration) {
	testing.Init() // registers -test.benchtime on flag.CommandLine; a no-op under go test
	if err := flag.Set("test.benchtime", d.String()); err != nil {
		panic(err) // the flag exists once Init has run
	}
}

func (b *bench) printHeader() {
	fmt.Fprintf(b.out, "dedupkit bench, run %s of %s: %s, GOMAXPROCS %d, %d rounds, %v per measurement\n",
		b.id, b.rev, runtime.Version(), runtime.GOMAXPROCS(0), b.cfg.rounds, b.cfg.duration)
	if w := b.embeddedWarning(); w != "" {
		fmt.Fprintln(b.out, w)
	}
}

// embeddedWarning is the line that says the figures are not throughput figures, or
// "" when every server is a real one.
func (b *bench) embeddedWarning() string {
	var emb []string
	if b.srv.redisEmbedded {
		emb = append(emb, "miniredis")
	}
	if b.srv.natsEmbedded {
		emb = append(emb, "an in-process NATS server")
	}
	if len(emb) == 0 {
		return ""
	}
	return fmt.Sprintf("!!! EMBEDDED SERVERS (%s): THESE FIGURES MEAN NOTHING FOR THROUGHPUT. Use -redis ADDR and -nats URL for real servers. !!!",
		strings.Join(emb, ", "))
}

// connect makes the Redis clients and the Deduper, and checks the server answers.
func (b *bench) connect(ctx context.Context) error {
	// Both built as the README builds its client (ContextTimeoutEnabled, so that the
	// client ends a call by its deadline), the same for ours and the hand-written.
	b.storeRDB = redis.NewClient(&redis.Options{Addr: b.srv.redisAddr, ContextTimeoutEnabled: true})
	b.plainRDB = redis.NewClient(&redis.Options{Addr: b.srv.redisAddr, ContextTimeoutEnabled: true})
	b.closers = append(b.closers, b.storeRDB.Close, b.plainRDB.Close, b.deleteKeys)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := b.plainRDB.Ping(pctx).Err(); err != nil {
		return fmt.Errorf("redis at %s: %w", b.srv.redisAddr, err)
	}
	store, err := redisstore.New(b.storeRDB)
	if err != nil {
		return err
	}
	if b.dd, err = dedup.New(store, dedup.WithPrefix(b.prefix)); err != nil {
		return err
	}
	b.closers = append(b.closers, b.dd.Close)
	// rueidis's defaults, but for its client-side cache, which needs RESP3 tracking
	// and is of no use to keys that are never read twice.
	if b.rue, err = rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{b.srv.redisAddr}, DisableCache: true}); err != nil {
		return fmt.Errorf("rueidis client for %s: %w", b.srv.redisAddr, err)
	}
	b.closers = append(b.closers, func() error { b.rue.Close(); return nil })
	// go-redis's automatic pipelining with its defaults (the blocking face), on a
	// client of its own so that its batches share no pool with the others.
	autoRDB := redis.NewClient(&redis.Options{Addr: b.srv.redisAddr})
	b.closers = append(b.closers, autoRDB.Close)
	if b.goAuto, err = autoRDB.AutoPipeline(); err != nil {
		return fmt.Errorf("go-redis AutoPipeline: %w", err)
	}
	b.closers = append(b.closers, b.goAuto.Close)
	// The same store code over go-redis's AutoPipeline (on a client of its own, with
	// go-redis's defaults) in place of a plain client: its single calls go through
	// the AutoPipeliner, its pipelines through the client's.
	apRDB := redis.NewClient(&redis.Options{Addr: b.srv.redisAddr})
	b.closers = append(b.closers, apRDB.Close)
	ap, err := apRDB.AutoPipeline()
	if err != nil {
		return fmt.Errorf("go-redis AutoPipeline: %w", err)
	}
	b.closers = append(b.closers, ap.Close)
	apStore, err := redisstore.New(ap)
	if err != nil {
		return err
	}
	if b.ddGoAuto, err = dedup.New(apStore, dedup.WithPrefix(b.prefix)); err != nil {
		return err
	}
	b.closers = append(b.closers, b.ddGoAuto.Close)
	return nil
}

// close undoes what the run did, last thing first: it stops consumers, deletes the
// stream, closes the Dedupers, deletes the run's keys and closes the clients.
func (b *bench) close() error {
	var errs []error
	for _, f := range slices.Backward(b.closers) {
		errs = append(errs, f())
	}
	return errors.Join(errs...)
}

// deleteKeys deletes every key under the run's prefix with SCAN and UNLINK: the
// server may be shared, so never FLUSHDB. It has its own deadline, as it also runs
// after an interrupt, which may leave a measurement's keys (up to a million or so)
// behind; most of them expire within the retention anyway.
func (b *bench) deleteKeys() error { return b.unlinkAll(context.Background(), 3*time.Minute) }

// record adds a measurement of round r, then deletes the keys the run has written
// (forget), so that the next measurement starts on a small keyspace.
func (b *bench) record(ctx context.Context, scenario, variant string, conc, r int, m metrics) error {
	b.res.add(scenario, variant, conc, r, m)
	return b.forget(ctx)
}

// forget deletes every key the run has written so far, between two measurements
// (outside their timers and CPU meters). Redis grows a database's hash tables by
// doubling them, and then moves every key to the new table a little at a time, on
// each command and in its cron: a resize of millions of keys made its commands 2 to
// 4 times dearer in CPU for seconds (a redis-benchmark SET NX PX run that crossed
// 4Mi keys here: 180–276k/s and 3.6–5.5 µs of Redis per SET for 6 s, then 530–660k/s
// and 1.5–1.9 µs). A run that kept its keys (over 20M by its end) paid for those
// resizes in whichever measurements happened to run then.
func (b *bench) forget(ctx context.Context) error { return b.unlinkAll(ctx, 2*time.Minute) }

// unlinkAll deletes every key under the run's prefix, within timeout.
func (b *bench) unlinkAll(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := embedded.DeleteKeys(ctx, b.plainRDB, b.prefix); err != nil {
		return fmt.Errorf("delete keys under %s: %w", b.prefix, err)
	}
	return nil
}

// note records something skipped or noticed, for the report and the JSON.
func (b *bench) note(format string, args ...any) {
	b.notes = append(b.notes, fmt.Sprintf(format, args...))
}

// revision names the code the run measured: the commit Go stamped into the binary
// (go build in a git checkout, unless -buildvcs=false; go run never stamps), else the
// HEAD of the git work tree the program runs in, which is the code measured when it
// runs as `go run ./bench` from a checkout. "+modified" marks a tree that differs
// from its commit, untracked files included, as Go's own vcs.modified does; "unknown"
// outside a git checkout.
func revision() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		var rev, modified string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
		if rev != "" {
			if modified == "true" {
				rev += "+modified"
			}
			return rev
		}
	}
	out, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	rev := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		rev += "+modified"
	}
	return rev
}
