package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite" // database/sql driver "sqlite"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/embedded"
	dnats "github.com/dedupkit/dedupkit/nats"
	"github.com/dedupkit/dedupkit/sqltx"
)

// `go run ./bench outage` prints issue 26's second figure: "with Redis SIGKILLed for
// 5 s under a steady transactional load, messages/s during the outage reach at least
// 25 % of the rate before it. 0 lost, 0 repeated effects."
//
// It spawns a redis-server of its own (never a shared one) without persistence, on a
// free loopback port, and a go-redis client as the README builds it
// (redis.NewClient(&redis.Options{Addr: ...}), defaults). One dedup.Deduper (default
// options) registers one handler with default options: a transactional run claims
// nothing in Redis, so none is needed to go on through the outage. Its runs are dedup.DoTx on a sqltx transactor over PostgreSQL
// (-postgres) or a SQLite file (modernc.org/sqlite, as the examples open it), with
// a marker table and an effects table of the run's own (dropped at the end); each
// run's fn inserts one row (key, worker) into the effects table, which has no unique
// constraint: a second row for a key is a repeated effect.
//
// The load: -workers goroutines, each taking a fresh key after another, as fast as
// the runs go; every -dup-every-th message of a worker is instead a re-run of a key
// it has already committed, which must answer Duplicate. A run whose outcome asks for
// another delivery is run again by its worker, after the delay the dnats adapter would
// have the broker wait (StoreUnavailable: dnats.DefaultStoreRetryDelay; InProgress and
// CommitUnknown: the RetryAfter; Failed: dnats.DefaultBackoff; Panicked: at once;
// LeaseLost and Cancelled: the server's default AckWait, 30 s), until it is final
// (Processed, Duplicate, NotRecorded; NoKey and KeyReuse, which the adapter
// terminates, are final too). A message is counted in the second its final run
// returns; a run (one DoTx call) in the phase it starts in.
//
// The timeline: -warm of load, -window "before", SIGKILL of redis-server, -seconds
// "during", the server started again on the same port (it comes back empty), -window
// "after". Then the workers finish the message in hand (within -drain) and stop, and
// the effects table is read:
//
//   - lost: fresh keys a worker started whose effect row is missing (a message still
//     being retried when -drain ran out is lost too; the report says how many);
//   - repeated: rows beyond one per key, fresh or re-run.
//
// The figure passes when the messages/s during the outage are at least 25 % of those
// before it, and nothing is lost or repeated; the command exits non-zero otherwise.
//
//	go run ./bench outage
//	go run ./bench outage -postgres postgres://postgres@127.0.0.1:5432/test?sslmode=disable -seconds 5

// outageConfig is what the outage flags say.
type outageConfig struct {
	redisBin     string
	postgres     string // "" for a SQLite file
	seconds      float64
	warm, window time.Duration
	drain        time.Duration
	workers      int
	dupEvery     int
	baseDir      string // not a flag: where the temp dir goes ("" for os.TempDir)
}

const (
	outageBound   = 0.25             // during/before must reach this
	outageAckWait = 30 * time.Second // the server's default AckWait: LeaseLost and Cancelled wait for it
)

func parseOutageFlags(args []string, stderr io.Writer) (outageConfig, error) {
	var c outageConfig
	fs := flag.NewFlagSet("bench outage", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.redisBin, "redis-bin", "redis-server", "the redis-server binary to spawn (a name on PATH, or a path to a file named redis-server)")
	fs.StringVar(&c.postgres, "postgres", "", "PostgreSQL URL (default: a SQLite file in a temp dir)")
	fs.Float64Var(&c.seconds, "seconds", 5, "seconds Redis stays down")
	fs.DurationVar(&c.warm, "warm", 5*time.Second, "load before the measurements start")
	fs.DurationVar(&c.window, "window", 5*time.Second, "length of the before and after measurements")
	fs.DurationVar(&c.drain, "drain", time.Minute, "how long the workers may take to finish their messages in hand at the end")
	fs.IntVar(&c.workers, "workers", 8, "goroutines running messages, each one at a time")
	fs.IntVar(&c.dupEvery, "dup-every", 10, "every n-th message of a worker re-runs a key it has committed (0: none)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	case c.seconds <= 0 || c.seconds > 3600:
		return c, fmt.Errorf("-seconds %v is outside (0, 3600]", c.seconds)
	case c.warm < 0:
		return c, fmt.Errorf("-warm %v is negative", c.warm)
	case c.window <= 0:
		return c, fmt.Errorf("-window %v is not positive", c.window)
	case c.drain <= 0:
		return c, fmt.Errorf("-drain %v is not positive", c.drain)
	case c.workers < 1 || c.workers > 1024:
		return c, fmt.Errorf("-workers %d is outside 1..1024", c.workers)
	case c.dupEvery < 0 || c.dupEvery == 1:
		return c, fmt.Errorf("-dup-every %d: want 0 (none) or at least 2", c.dupEvery)
	}
	return c, nil
}

// runOutage is `bench outage`.
func runOutage(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseOutageFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := useRedisBin(cfg.redisBin); err != nil {
		return err
	}
	return outage(ctx, cfg, stdout)
}

// useRedisBin makes bin the redis-server that internal/embedded spawns (it runs the
// one named redis-server on PATH): a path to another one puts its directory first on
// this process's PATH.
func useRedisBin(bin string) error {
	path, err := exec.LookPath(bin)
	if err != nil {
		return fmt.Errorf("-redis-bin: %w", err)
	}
	if bin == "redis-server" {
		return nil
	}
	if filepath.Base(path) != "redis-server" {
		return fmt.Errorf("-redis-bin %s: the binary must be named redis-server", bin)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	return os.Setenv("PATH", filepath.Dir(abs)+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// outagePhase is one measured stretch of the timeline.
type outagePhase struct {
	name       string
	from, to   time.Time
	msgs, news int // messages made final in it; those of fresh keys
	runs       []time.Duration
	outcomes   map[dedup.Outcome]int
}

func (p *outagePhase) seconds() float64 { return p.to.Sub(p.from).Seconds() }
func (p *outagePhase) rate() float64    { return float64(p.msgs) / p.seconds() }
func (p *outagePhase) has(t time.Time) bool {
	return !t.Before(p.from) && t.Before(p.to)
}

// outageRun is one DoTx call; outageDone one message made final.
type outageRun struct {
	start   time.Time
	took    time.Duration
	outcome dedup.Outcome
}

type outageDone struct {
	at    time.Time
	fresh bool
}

// outageWorker is what one worker did; only it writes it until the workers stop.
type outageWorker struct {
	runs       []outageRun
	done       []outageDone
	fresh      int      // fresh keys started: w<w>-0 .. w<w>-<fresh-1>
	committed  []string // fresh keys made final, the pool of re-runs
	reruns     map[dedup.Outcome]int
	unfinished int // messages still not final when the drain ran out
}

// outage runs the figure and prints it.
func outage(ctx context.Context, cfg outageConfig, stdout io.Writer) (err error) {
	dir, err := os.MkdirTemp(cfg.baseDir, "dedupkit-outage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv, err := embedded.StartRedisServer(filepath.Join(dir, "redis"))
	if err != nil {
		return fmt.Errorf("spawn redis-server: %w", err)
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	version := "?"
	if info, err := rdb.Info(ctx, "server").Result(); err == nil {
		for line := range strings.SplitSeq(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "redis_version:"); ok {
				version = v
			}
		}
	}

	id := runID()
	driver, dsn, dialect, dbName := "sqlite", "file:"+filepath.Join(dir, "outage.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)", sqltx.SQLite, "a SQLite file"
	if cfg.postgres != "" {
		driver, dsn, dialect, dbName = "pgx", cfg.postgres, sqltx.PostgreSQL, "PostgreSQL"
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	markers, effects := "dkoutage_mk_"+id, "dkoutage_fx_"+id
	tr, err := sqltx.New(db, dialect, sqltx.WithTable(markers))
	if err != nil {
		return err
	}
	defer tr.Close()
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, t := range []string{effects, markers} {
			if _, derr := db.ExecContext(dctx, "DROP TABLE IF EXISTS "+t); derr != nil {
				fmt.Fprintln(os.Stderr, "outage: drop", t+":", derr)
			}
		}
	}()
	if err := tr.Migrate(ctx); err != nil {
		return fmt.Errorf("create the marker table: %w", err)
	}
	// No unique constraint: a second row for a key is the repeated effect counted.
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+effects+" (msg VARCHAR(64) NOT NULL, worker INTEGER NOT NULL)"); err != nil {
		return fmt.Errorf("create the effects table: %w", err)
	}
	insert := "INSERT INTO " + effects + " (msg, worker) VALUES (?, ?)"
	if dialect == sqltx.PostgreSQL {
		insert = "INSERT INTO " + effects + " (msg, worker) VALUES ($1, $2)"
	}

	st, err := redisstore.New(rdb)
	if err != nil {
		return err
	}
	dd, err := dedup.New(st)
	if err != nil {
		return err
	}
	defer dd.Close()
	h, err := dd.Register("outage")
	if err != nil {
		return err
	}

	down := time.Duration(cfg.seconds * float64(time.Second))
	fmt.Fprintf(stdout, "outage: redis-server %s spawned at %s without persistence (it restarts empty); database: %s\n", version, srv.Addr(), dbName)
	fmt.Fprintf(stdout, "%d workers, dedup.DoTx on sqltx; handler with default options; go-redis client with default options\n", cfg.workers)
	dupNote := "no re-runs"
	if cfg.dupEvery > 0 {
		dupNote = fmt.Sprintf("1 message in %d of each worker re-runs a key it committed", cfg.dupEvery)
	}
	fmt.Fprintf(stdout, "%s; timeline: warm %v, before %v, Redis SIGKILLed for %v, after %v\n\n", dupNote, cfg.warm, cfg.window, down, cfg.window)

	// The workers.
	wctx, cancelWorkers := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWorkers()
	var stopping atomic.Bool
	workers := make([]*outageWorker, cfg.workers)
	var wg sync.WaitGroup
	for w := range workers {
		ow := &outageWorker{reruns: map[dedup.Outcome]int{}}
		workers[w] = ow
		wg.Go(func() { ow.loop(wctx, &stopping, w, cfg.dupEvery, h, tr, insert) })
	}
	stopWorkers := func() {
		stopping.Store(true)
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(cfg.drain):
			cancelWorkers() // what is still being retried ends Cancelled: counted unfinished
			<-done
		}
	}
	defer stopWorkers()

	// The timeline.
	sleep := func(d time.Duration) error {
		select {
		case <-time.After(d):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := sleep(cfg.warm); err != nil {
		return err
	}
	before := &outagePhase{name: "before", from: time.Now()}
	if err := sleep(cfg.window); err != nil {
		return err
	}
	srv.Kill()
	killed := time.Now()
	before.to = killed
	during := &outagePhase{name: "during", from: killed}
	sleepErr := sleep(down)
	if err := srv.Start(); err != nil {
		return fmt.Errorf("restart redis-server: %w", err)
	}
	during.to = time.Now()
	if sleepErr != nil {
		return sleepErr
	}
	after := &outagePhase{name: "after", from: during.to}
	if err := sleep(cfg.window); err != nil {
		return err
	}
	after.to = time.Now()
	stopWorkers()

	// What happened.
	phases := []*outagePhase{before, during, after}
	for _, p := range phases {
		p.outcomes = map[dedup.Outcome]int{}
	}
	reruns := map[dedup.Outcome]int{}
	unfinished, started := 0, 0
	for _, ow := range workers {
		for _, r := range ow.runs {
			for _, p := range phases {
				if p.has(r.start) {
					p.runs = append(p.runs, r.took)
					p.outcomes[r.outcome]++
				}
			}
		}
		for _, d := range ow.done {
			for _, p := range phases {
				if p.has(d.at) {
					p.msgs++
					if d.fresh {
						p.news++
					}
				}
			}
		}
		for o, n := range ow.reruns {
			reruns[o] += n
		}
		unfinished += ow.unfinished
		started += ow.fresh
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	lost, repeated, err := countOutageEffects(rctx, db, effects, workers)
	if err != nil {
		return err
	}

	fmt.Fprintf(stdout, "%-7s %9s %9s %6s %9s %9s %9s  %s\n", "", "msgs/s", "new/s", "runs", "run mean", "run p50", "run p99", "outcomes of the runs started in it")
	for _, p := range phases {
		slices.Sort(p.runs)
		var sum time.Duration
		for _, d := range p.runs {
			sum += d
		}
		mean := time.Duration(0)
		if len(p.runs) > 0 {
			mean = sum / time.Duration(len(p.runs))
		}
		fmt.Fprintf(stdout, "%-7s %9.1f %9.1f %6d %9s %9s %9s  %s  (%.2f s)\n", p.name, p.rate(), float64(p.news)/p.seconds(), len(p.runs),
			fmtDur(mean), fmtDur(percentile(p.runs, 50)), fmtDur(percentile(p.runs, 99)), fmtOutcomeCounts(p.outcomes), p.seconds())
	}
	r := ratio(during.rate(), before.rate())
	s := h.Stats()
	fmt.Fprintf(stdout, "\nduring/before: %.3f (bound ≥ %.2f)\n", r, outageBound)
	fmt.Fprintf(stdout, "keys started %d; re-runs of committed keys: %s; duplicates the markers answered %d\n",
		started, fmtOutcomeCounts(reruns), s.DatabaseDuplicates)
	fmt.Fprintf(stdout, "lost %d (of which still being retried at the end: %d); repeated effects %d\n", lost, unfinished, repeated)

	var why []string
	if !(r >= outageBound) { // NaN fails too
		why = append(why, fmt.Sprintf("during/before %.3f < %.2f", r, outageBound))
	}
	if lost > 0 {
		why = append(why, fmt.Sprintf("%d lost", lost))
	}
	if repeated > 0 {
		why = append(why, fmt.Sprintf("%d repeated effects", repeated))
	}
	if len(why) == 0 {
		fmt.Fprintln(stdout, "outage: PASS")
		return nil
	}
	fmt.Fprintln(stdout, "outage: FAIL: "+strings.Join(why, "; "))
	return fmt.Errorf("outage: %w: %s", errFigureFailed, strings.Join(why, "; "))
}

// loop runs messages until stopping, each until final (or ctx ends).
func (ow *outageWorker) loop(ctx context.Context, stopping *atomic.Bool, w, dupEvery int, h *dedup.Handler, tr *sqltx.Transactor, insert string) {
	rng := rand.New(rand.NewPCG(uint64(w), 0x07a6e))
	for n := 0; !stopping.Load(); n++ {
		key, fresh := "", true
		if dupEvery > 0 && n%dupEvery == dupEvery-1 && len(ow.committed) > 0 {
			key, fresh = ow.committed[rng.IntN(len(ow.committed))], false
		} else {
			key = "w" + strconv.Itoa(w) + "-" + strconv.Itoa(ow.fresh)
			ow.fresh++
		}
		fn := func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, insert, key, w)
			return err
		}
		for attempt := uint64(1); ; attempt++ {
			start := time.Now()
			res, _ := dedup.DoTx(ctx, h, key, tr, fn)
			ow.runs = append(ow.runs, outageRun{start: start, took: time.Since(start), outcome: res.Outcome})
			if outageFinal(res.Outcome) {
				ow.done = append(ow.done, outageDone{at: time.Now(), fresh: fresh})
				if fresh {
					ow.committed = append(ow.committed, key)
				} else {
					ow.reruns[res.Outcome]++
				}
				break
			}
			select {
			case <-time.After(outageRetryDelay(res, attempt)):
				continue
			case <-ctx.Done():
			}
			ow.unfinished++
			return
		}
	}
}

// outageFinal reports an outcome after which the broker would not deliver the
// message again: acked (Processed, Duplicate, NotRecorded) or terminated (NoKey,
// KeyReuse).
func outageFinal(o dedup.Outcome) bool {
	switch o {
	case dedup.Processed, dedup.Duplicate, dedup.NotRecorded, dedup.NoKey, dedup.KeyReuse:
		return true
	}
	return false
}

// outageRetryDelay is how long the broker would wait before delivering the message
// again, as the dnats adapter acknowledges res with its default options.
func outageRetryDelay(res dedup.Result, attempt uint64) time.Duration {
	switch res.Outcome {
	case dedup.StoreUnavailable:
		return dnats.DefaultStoreRetryDelay
	case dedup.InProgress, dedup.CommitUnknown:
		return max(res.RetryAfter, dnats.DefaultMinDelay)
	case dedup.Failed:
		return dnats.DefaultBackoff(attempt)
	case dedup.Panicked:
		return 0
	}
	return outageAckWait // LeaseLost, Cancelled: no ack, redelivered after AckWait
}

// countOutageEffects reads the effects table: lost (fresh keys started whose row is
// missing) and repeated (rows beyond one per key).
func countOutageEffects(ctx context.Context, db *sql.DB, effects string, workers []*outageWorker) (lost, repeated int, err error) {
	rows, err := db.QueryContext(ctx, "SELECT msg, COUNT(*) FROM "+effects+" GROUP BY msg")
	if err != nil {
		return 0, 0, fmt.Errorf("read the effects: %w", err)
	}
	defer rows.Close()
	perKey := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			return 0, 0, fmt.Errorf("read the effects: %w", err)
		}
		perKey[k] = n
		repeated += max(n-1, 0)
	}
	if err := rows.Err(); err != nil {
		return 0, 0, fmt.Errorf("read the effects: %w", err)
	}
	known := 0
	for w, ow := range workers {
		for i := range ow.fresh {
			if n, ok := perKey["w"+strconv.Itoa(w)+"-"+strconv.Itoa(i)]; ok && n > 0 {
				known++
			} else {
				lost++
			}
		}
	}
	if known != len(perKey) {
		return lost, repeated, fmt.Errorf("the effects table holds %d keys no worker started", len(perKey)-known)
	}
	return lost, repeated, nil
}

// fmtOutcomeCounts renders outcome counts, e.g. "processed=900 duplicate=100".
func fmtOutcomeCounts(m map[dedup.Outcome]int) string {
	u := make(map[dedup.Outcome]uint64, len(m))
	for o, n := range m {
		u[o] = uint64(n)
	}
	return fmtOutcomes(u)
}

// fmtDur renders a run's time: ms with three digits below a second, else seconds;
// "-" for none.
func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Second:
		return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'g', 3, 64) + "ms"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 2, 64) + "s"
}
