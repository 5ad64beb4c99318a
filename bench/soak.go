package main

import (
	"context"
	"encoding/json"
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
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/internal/embedded"
)

// `bench soak` is the chaos soak: it publishes -messages messages to a JetStream
// stream and has -consumers consumer processes (soak_consumer.go) run them through
// one dedup handler in Do mode, while faults are injected throughout:
//
//   - in the consumers: 5% of the handler's runs fail (the adapter Naks them with a
//     short backoff), and 1% of the acks are silently not sent (redelivered after
//     AckWait, then answered Duplicate);
//   - by the soak: 2 consumers are SIGKILLed at random points of the run (each
//     replaced at once by a new process), and the dedup Redis, a redis-server with
//     appendonly yes and appendfsync always, is SIGKILLed once mid-run and started
//     again on the same port and directory after -redis-down (meanwhile the
//     consumers fail closed: StoreUnavailable, NakWithDelay).
//
// The points are fractions of the messages committed so far, drawn from -seed. Once
// every fault is injected and the durable consumer has nothing pending and nothing
// awaiting an ack, the soak stops the consumers (SIGTERM), reads the ledger
// (soak_ledger.go), and prints one JSON line, last on stdout:
//
//	{"messages":…,"deliveries":…,"lost":0,"duplicate_successes":0,"uncommitted_effects":…,
//	 "kills":[{"pid":…,"at_commits":…,"handlers_in_flight":…,"effects_in_flight":…,
//	 "uncommitted_effects":…},…],"consumer_kills":2,"redis_restarts":1,"naks_injected":…, …}
//
// It exits non-zero unless lost, duplicate_successes and phantom_successes are 0, every
// fault was injected, no consumer exited on its own, and it finished within -timeout
// (on a timeout it prints what it knows).
//
// What counts (soak_ledger.go has the rules): a successful run of a message is one
// dedup took as its processing, Processed or NotRecorded; lost counts messages with
// none, duplicate_successes the ones beyond the first, less those that follow a
// NotRecorded success (acked, no DONE; if a SIGKILL loses that ack too, the message
// rightly runs again: not_recorded_repeats). uncommitted_effects counts side
// effects of runs that never succeeded: a consumer SIGKILLed after its side effect and
// before its DONE write leaves one, and the message rightly runs again. That is the
// crash window of any at-least-once consumer, so it is reported and does not fail the
// soak. kills lists each SIGKILL with the runs the process had in hand
// (handlers_in_flight), those of them that had made their side effect
// (effects_in_flight), and the process's uncommitted effects: since each run's
// completion is sent as its fn returns, those are at most its effects in flight.
// Nor is an ack dropped after NotRecorded: a lost DONE write and a lost ack
// together make the duplicate the README's Limits name, not one dedup claims to stop.
//
// -tx runs the transactional variant (soak_tx.go): the handler commits its side
// effect as a row of a PostgreSQL table (-postgres, or DEDUP_POSTGRES_URL) in the
// transaction of its marker (dnats.TxHandler, pgxtx), the dedup Redis keeps nothing
// on disk (its restart loses every record), and the verdict reads the table: lost
// (messages without a row) and effects_repeated (rows beyond one) must be 0.
// database_duplicates counts the duplicates the markers answered.
//
// Servers: the dedup Redis and the ledger Redis are redis-server processes it spawns
// (redis-server must be on PATH) in a temp dir. NATS is an in-process server
// (internal/embedded), unless -nats names one: NATS is not a fault target here, and
// in process it needs no binary and cannot outlive the soak. Every process it
// starts is stopped by its PID, also on failure, and the temp dir is removed.
//
//	go run ./bench soak
//	go run ./bench soak -messages 20000 -consumers 3 -timeout 5m
//	go run ./bench soak -tx -postgres postgres://postgres@127.0.0.1:5432/test

// soakConfig is what the soak's flags say.
type soakConfig struct {
	messages, consumers int
	timeout             time.Duration
	seed                uint64
	natsURL             string
	concurrency         int
	kills, restarts     int
	nakRate, dropRate   float64
	redisDown           time.Duration
	verbose             bool
	tx                  bool   // the transactional variant (soak_tx.go)
	postgres            string // its database

	// Not flags: where the temp dir goes ("" for os.TempDir), and how a consumer
	// process is started (nil: this binary's soak-consumer subcommand).
	baseDir string
	command func(args []string) (*exec.Cmd, error)
}

// The JetStream consumer and dedup settings. AckWait is short so that a lost ack or a
// killed consumer's messages come back soon; the lease is short so that a killed
// consumer's claims expire soon (the heartbeat keeps a live one's). MaxDeliver is high
// enough never to be reached (an exhausted message is counted, and is lost); the
// retention outlives AckWait × MaxDeliver, as dnats.NewJetStream checks.
const (
	soakAckWait    = 2 * time.Second
	soakMaxDeliver = 1000
	soakLease      = 2 * time.Second
	soakRetention  = 2 * time.Hour
	soakBuffer     = 128 // messages Consume keeps buffered per consumer
	soakDurable    = "soak"
)

func parseSoakFlags(args []string, stderr io.Writer) (soakConfig, error) {
	var c soakConfig
	fs := flag.NewFlagSet("bench soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.messages, "messages", 100_000, "messages to publish; each must be processed exactly once")
	fs.IntVar(&c.consumers, "consumers", 3, "consumer processes")
	fs.DurationVar(&c.timeout, "timeout", 5*time.Minute, "give up (print what is known, exit non-zero) after this")
	fs.Uint64Var(&c.seed, "seed", 0, "seed of the fault schedule (0: random; the JSON says which)")
	fs.StringVar(&c.natsURL, "nats", "", "NATS URL (default: an in-process server)")
	fs.IntVar(&c.concurrency, "concurrency", 32, "messages each consumer handles at once")
	fs.IntVar(&c.kills, "kills", 2, "consumer processes to SIGKILL")
	fs.IntVar(&c.restarts, "redis-restarts", 1, "restarts of the dedup Redis")
	fs.Float64Var(&c.nakRate, "nak-rate", 0.05, "share of handler runs that fail (Nak)")
	fs.Float64Var(&c.dropRate, "drop-rate", 0.01, "share of acks not sent")
	fs.DurationVar(&c.redisDown, "redis-down", 3*time.Second, "how long the dedup Redis stays down at each restart (go-redis rides out about 1.5 s by itself)")
	fs.BoolVar(&c.verbose, "v", false, "progress and the library's warnings on stderr")
	fs.BoolVar(&c.tx, "tx", false, "transactional variant: the handler commits its effect in PostgreSQL with its marker (dnats.TxHandler, pgxtx), and the dedup Redis keeps nothing on disk")
	fs.StringVar(&c.postgres, "postgres", os.Getenv("DEDUP_POSTGRES_URL"), "PostgreSQL URL of the transactional variant (env DEDUP_POSTGRES_URL)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	case c.messages < 1 || c.messages > 10_000_000:
		return c, fmt.Errorf("-messages %d is outside 1..10000000", c.messages)
	case c.consumers < 1 || c.consumers > 64:
		return c, fmt.Errorf("-consumers %d is outside 1..64", c.consumers)
	case c.timeout <= 0:
		return c, fmt.Errorf("-timeout %v is not positive", c.timeout)
	case c.concurrency < 1 || c.concurrency > 4096:
		return c, fmt.Errorf("-concurrency %d is outside 1..4096", c.concurrency)
	case c.kills < 0 || c.restarts < 0:
		return c, errors.New("-kills and -redis-restarts must not be negative")
	case c.nakRate < 0 || c.nakRate >= 1 || c.dropRate < 0 || c.dropRate >= 1:
		return c, fmt.Errorf("-nak-rate %v and -drop-rate %v must be in [0, 1)", c.nakRate, c.dropRate)
	case c.redisDown < 0:
		return c, fmt.Errorf("-redis-down %v is negative", c.redisDown)
	case c.tx && c.postgres == "":
		return c, errors.New("-tx needs -postgres (or DEDUP_POSTGRES_URL)")
	}
	if c.seed == 0 {
		c.seed = rand.Uint64()
	}
	return c, nil
}

// soakReport is the JSON line.
type soakReport struct {
	Messages           int    `json:"messages"`
	Deliveries         uint64 `json:"deliveries"`
	Lost               int    `json:"lost"`
	DuplicateSuccesses int    `json:"duplicate_successes"`
	PhantomSuccesses   int    `json:"phantom_successes"`
	UncommittedEffects *int   `json:"uncommitted_effects,omitempty"` // not in the tx variant: a row is committed or not there
	// Mode is "tx" for the transactional variant: its effects are rows committed in
	// PostgreSQL with their markers, lost and EffectsRepeated count them, and the
	// dedup Redis keeps nothing on disk (a restart loses every record).
	Mode            string `json:"mode,omitempty"`
	EffectsRepeated *int   `json:"effects_repeated,omitempty"`
	// DatabaseDuplicates counts the duplicates the markers answered (the store had
	// no DONE record: lost in the restart, or a completion a kill cut short).
	DatabaseDuplicates *uint64 `json:"database_duplicates,omitempty"`
	// Kills says, per consumer SIGKILL, what the process had in hand and what it left.
	Kills              []soakKill `json:"kills"`
	NotRecordedRepeats int        `json:"not_recorded_repeats"`
	ConsumerKills      int        `json:"consumer_kills"`
	RedisRestarts      int        `json:"redis_restarts"`
	RedisDownS         float64    `json:"redis_down_s"`
	NaksInjected       int64      `json:"naks_injected"`
	AcksDropped        int64      `json:"acks_dropped"`
	StoreUnavailable   uint64     `json:"store_unavailable"`
	NotRecorded        uint64     `json:"not_recorded"`
	Exhausted          int64      `json:"exhausted"`
	// Outcomes and actions as the consumers counted them, summed over every process;
	// a killed process's last quarter second is missing.
	Outcomes      map[string]uint64 `json:"outcomes"`
	Consumers     int               `json:"consumers"`
	ConsumerExits int               `json:"consumer_exits"` // exits nobody asked for
	Seed          uint64            `json:"seed"`
	DurationS     float64           `json:"duration_s"`
	TimedOut      bool              `json:"timed_out,omitempty"`
	Error         string            `json:"error,omitempty"`
	OK            bool              `json:"ok"`
}

// soakKill is one consumer SIGKILL: the runs the process had in hand at the kill
// (its handler had started them; dedup had not completed or released their claims),
// how many of those had made their side effect, and how many of its runs' side
// effects never became successful (its share of uncommitted_effects).
type soakKill struct {
	PID                int  `json:"pid"`
	AtCommits          int  `json:"at_commits"`
	HandlersInFlight   int  `json:"handlers_in_flight"`
	EffectsInFlight    *int `json:"effects_in_flight,omitempty"`   // not in the tx variant
	UncommittedEffects *int `json:"uncommitted_effects,omitempty"` // not in the tx variant
}

// verdict says why the report fails, or nil.
func (r *soakReport) verdict(cfg soakConfig) error {
	var why []string
	if r.Error != "" {
		why = append(why, r.Error)
	}
	if r.Lost != 0 || r.DuplicateSuccesses != 0 || r.PhantomSuccesses != 0 {
		why = append(why, fmt.Sprintf("%d lost, %d duplicate successes, %d phantom successes",
			r.Lost, r.DuplicateSuccesses, r.PhantomSuccesses))
	}
	if cfg.tx && (r.EffectsRepeated == nil || *r.EffectsRepeated != 0) {
		why = append(why, fmt.Sprintf("effects repeated: %v", fmtCount(r.EffectsRepeated)))
	}
	if r.ConsumerKills != cfg.kills || r.RedisRestarts != cfg.restarts ||
		(cfg.nakRate > 0 && r.NaksInjected == 0) || (cfg.dropRate > 0 && r.AcksDropped == 0) {
		why = append(why, fmt.Sprintf("faults not all injected: %d/%d consumer kills, %d/%d redis restarts, %d naks, %d dropped acks",
			r.ConsumerKills, cfg.kills, r.RedisRestarts, cfg.restarts, r.NaksInjected, r.AcksDropped))
	}
	if r.ConsumerExits != 0 {
		why = append(why, fmt.Sprintf("%d consumer processes exited on their own", r.ConsumerExits))
	}
	if len(why) == 0 {
		return nil
	}
	return errors.New("soak failed: " + strings.Join(why, "; "))
}

// runSoak is `bench soak`.
func runSoak(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseSoakFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	return soak(ctx, cfg, stdout, stderr)
}

// soak runs one soak and prints its JSON line; the error says why it failed.
func soak(ctx context.Context, cfg soakConfig, stdout, stderr io.Writer) (err error) {
	start := time.Now()
	rep := &soakReport{Messages: cfg.messages, Consumers: cfg.consumers, Seed: cfg.seed, Outcomes: map[string]uint64{}}
	s := &soakRun{cfg: cfg, rep: rep, stderr: stderr, rng: rand.New(rand.NewPCG(cfg.seed, 0x50a6))}
	defer func() {
		s.close()
		rep.DurationS = time.Since(start).Seconds()
		if err != nil && rep.Error == "" {
			rep.Error = err.Error()
		}
		err = rep.verdict(cfg)
		rep.OK = err == nil
		if err != nil {
			rep.Error = err.Error()
		}
		line, jerr := json.Marshal(rep)
		if jerr != nil {
			err = errors.Join(err, jerr)
			return
		}
		fmt.Fprintln(stdout, string(line))
	}()

	runCtx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	runErr := s.setUp(runCtx)
	if runErr == nil {
		runErr = s.run(runCtx)
	}
	if runCtx.Err() != nil && ctx.Err() == nil {
		rep.TimedOut = true
		if runErr == nil || errors.Is(runErr, context.DeadlineExceeded) {
			runErr = fmt.Errorf("timed out after %v", cfg.timeout)
		} else {
			runErr = fmt.Errorf("timed out after %v: %w", cfg.timeout, runErr)
		}
	}
	// Whatever happened, stop the consumers and count: the report says what is known.
	fin, cancelFin := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancelFin()
	return errors.Join(runErr, s.finish(fin))
}

// soakRun is one soak's servers, processes and state.
type soakRun struct {
	cfg    soakConfig
	rep    *soakReport
	stderr io.Writer
	rng    *rand.Rand

	dir        string
	dedupRedis *embedded.Proc
	ledgerSrv  *embedded.Proc
	nats       *embedded.NATS
	natsURL    string
	nc         *natsgo.Conn
	js         jetstream.JetStream
	stream     string
	prefix     string
	ledger     *redis.Client
	dedupRDB   *redis.Client
	txMarkers  string // the transactional variant's tables (soak_tx.go)
	txEffects  string
	pg         *pgxpool.Pool
	procs      []*consumerProc
	started    int // consumer processes started, replacements included
	closers    []func()
}

func (s *soakRun) logf(format string, args ...any) {
	if s.cfg.verbose {
		fmt.Fprintf(s.stderr, "soak: "+format+"\n", args...)
	}
}

// setUp starts the servers, creates the stream and durable consumer, publishes the
// messages and starts the consumer processes.
func (s *soakRun) setUp(ctx context.Context) error {
	var err error
	if s.dir, err = os.MkdirTemp(s.cfg.baseDir, "dedupkit-soak-"); err != nil {
		return err
	}
	s.closers = append(s.closers, func() { os.RemoveAll(s.dir) })
	id := runID()
	s.stream, s.prefix = "DKSOAK_"+strings.ToUpper(id), "dksoak-"+id

	persist := []string{"--appendonly", "yes", "--appendfsync", "always"}
	if s.cfg.tx { // the markers answer for the records a restart loses
		persist = nil
		s.rep.Mode = "tx"
	}
	if s.dedupRedis, err = embedded.StartRedisServer(filepath.Join(s.dir, "redis"),
		append(persist, "--maxmemory-policy", "noeviction")...); err != nil {
		return fmt.Errorf("dedup redis: %w", err)
	}
	s.closers = append(s.closers, s.dedupRedis.Stop)
	if s.ledgerSrv, err = embedded.StartRedisServer(filepath.Join(s.dir, "ledger")); err != nil {
		return fmt.Errorf("ledger redis: %w", err)
	}
	s.closers = append(s.closers, s.ledgerSrv.Stop)
	s.ledger = redis.NewClient(&redis.Options{Addr: s.ledgerSrv.Addr()})
	s.closers = append(s.closers, func() { s.ledger.Close() })
	s.dedupRDB = redis.NewClient(&redis.Options{Addr: s.dedupRedis.Addr()})
	s.closers = append(s.closers, func() { s.dedupRDB.Close() })

	s.natsURL = s.cfg.natsURL
	if s.natsURL == "" {
		if s.nats, err = embedded.StartNATS(filepath.Join(s.dir, "nats")); err != nil {
			return err
		}
		s.closers = append(s.closers, s.nats.Close)
		s.natsURL = s.nats.URL()
	}
	if s.nc, err = natsgo.Connect(s.natsURL, natsgo.Name("dedupkit-soak")); err != nil {
		return fmt.Errorf("connect to nats: %w", err)
	}
	s.closers = append(s.closers, s.nc.Close)
	if s.js, err = jetstream.New(s.nc); err != nil {
		return err
	}
	subject := "dedupkit.soak." + id
	if _, err := s.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: s.stream, Subjects: []string{subject}, Storage: jetstream.MemoryStorage,
		MaxAge: 24 * time.Hour, // a safety net on a shared server, should the deletion not happen
	}); err != nil {
		return fmt.Errorf("create stream: %w", err)
	}
	s.closers = append(s.closers, func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.js.DeleteStream(dctx, s.stream); err != nil {
			fmt.Fprintln(s.stderr, "soak: delete stream:", err)
		}
	})
	if _, err := s.js.CreateOrUpdateConsumer(ctx, s.stream, jetstream.ConsumerConfig{
		Durable: soakDurable, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: soakAckWait, MaxDeliver: soakMaxDeliver,
		MaxAckPending: 2 * s.cfg.consumers * (soakBuffer + s.cfg.concurrency),
	}); err != nil {
		return fmt.Errorf("create consumer: %w", err)
	}
	if s.cfg.tx {
		if err := s.setUpTx(ctx, id); err != nil {
			return err
		}
	}
	if err := s.publish(ctx, subject); err != nil {
		return err
	}
	for range s.cfg.consumers {
		if err := s.startConsumer(); err != nil {
			return err
		}
	}
	return nil
}

// publish stores every message, each with its own Nats-Msg-Id, in windows of
// publishWindow (below the client's limit of outstanding async publishes, which
// fails a publish that waits on it for long).
func (s *soakRun) publish(ctx context.Context, subject string) error {
	const publishWindow = 2000
	futures := make([]jetstream.PubAckFuture, 0, publishWindow)
	for lo := 0; lo < s.cfg.messages; lo += publishWindow {
		futures = futures[:0]
		for i := lo; i < min(lo+publishWindow, s.cfg.messages); i++ {
			msg := natsgo.NewMsg(subject)
			msg.Data = []byte(`{"n":` + strconv.Itoa(i) + `}`)
			msg.Header.Set(jetstream.MsgIDHeader, soakMsgID(i))
			f, err := s.js.PublishMsgAsync(msg)
			if err != nil {
				return fmt.Errorf("publish: %w", err)
			}
			futures = append(futures, f)
		}
		for _, f := range futures {
			select {
			case ack := <-f.Ok():
				if ack.Duplicate {
					return fmt.Errorf("publish: %s taken as a duplicate", f.Msg().Header.Get(jetstream.MsgIDHeader))
				}
			case err := <-f.Err():
				return fmt.Errorf("publish: %w", err)
			case <-ctx.Done():
				return fmt.Errorf("publish: %w", ctx.Err())
			}
		}
	}
	s.logf("published %d messages to %s", s.cfg.messages, s.stream)
	return nil
}

// consumerProc is one consumer process.
type consumerProc struct {
	cmd    *exec.Cmd
	done   chan struct{} // closed once reaped
	err    error         // cmd.Wait's, once done
	wanted bool          // killed or stopped by the soak
}

func (p *consumerProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// startConsumer starts one more consumer process.
func (s *soakRun) startConsumer() error {
	cc := consumerConfig{
		natsURL: s.natsURL, redisAddr: s.dedupRedis.Addr(), ledgerAddr: s.ledgerSrv.Addr(),
		stream: s.stream, durable: soakDurable, prefix: s.prefix,
		concurrency: s.cfg.concurrency, buffer: soakBuffer, lease: soakLease, retention: soakRetention,
		nakRate: s.cfg.nakRate, dropRate: s.cfg.dropRate, verbose: s.cfg.verbose,
	}
	if s.cfg.tx {
		cc.txDSN, cc.txMarkers, cc.txEffects = s.cfg.postgres, s.txMarkers, s.txEffects
	}
	command := s.cfg.command
	if command == nil {
		command = selfCommand
	}
	cmd, err := command(cc.args())
	if err != nil {
		return err
	}
	cmd.Stdout = nil // the consumer reports through the ledger
	if f, ok := s.stderr.(*os.File); ok {
		cmd.Stderr = f // a file: no copying goroutine to wait for
	}
	embedded.DieWithParent(cmd) // none outlives the soak, should it die without stopping them
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start a consumer: %w", err)
	}
	p := &consumerProc{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	s.procs = append(s.procs, p)
	s.started++
	s.logf("consumer %d started, pid %d", s.started, cmd.Process.Pid)
	return nil
}

// selfCommand runs this binary's soak-consumer subcommand.
func selfCommand(args []string) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return exec.Command(exe, append([]string{"soak-consumer"}, args...)...), nil
}

// live returns the consumer processes the soak has not killed or stopped.
func (s *soakRun) live() []*consumerProc {
	var out []*consumerProc
	for _, p := range s.procs {
		if !p.wanted {
			out = append(out, p)
		}
	}
	return out
}

// killConsumer SIGKILLs a random live consumer, reaps it, notes what it had in hand,
// and starts a replacement.
func (s *soakRun) killConsumer(ctx context.Context, progress int) error {
	live := s.live()
	if len(live) == 0 {
		return errors.New("no live consumer to kill")
	}
	p := live[s.rng.IntN(len(live))]
	p.wanted = true
	_ = p.cmd.Process.Kill()
	<-p.done
	s.rep.ConsumerKills++
	pid := p.cmd.Process.Pid
	k := soakKill{PID: pid, AtCommits: progress}
	runs, err := s.ledger.SMembers(ctx, runKey(pid)).Result()
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	k.HandlersInFlight = len(runs)
	if !s.cfg.tx { // the tx variant's effects are rows, committed or not there
		made := 0
		for _, r := range runs {
			i, token, ok := parseRunName(r)
			if !ok {
				return fmt.Errorf("ledger: %q is not a run", r)
			}
			in, err := s.ledger.SIsMember(ctx, effectKey(i), token).Result()
			if err != nil {
				return fmt.Errorf("ledger: %w", err)
			}
			if in {
				made++
			}
		}
		k.EffectsInFlight = &made
	}
	s.rep.Kills = append(s.rep.Kills, k)
	s.logf("consumer pid %d SIGKILLed with %d runs in hand", pid, k.HandlersInFlight)
	return s.startConsumer()
}

// restartRedis SIGKILLs the dedup Redis, leaves it down for -redis-down, and starts it
// again on the same port and directory: it loads its AOF (appendfsync always).
func (s *soakRun) restartRedis(ctx context.Context) error {
	down := time.Now()
	s.dedupRedis.Kill()
	s.logf("dedup redis SIGKILLed")
	select {
	case <-time.After(s.cfg.redisDown):
	case <-ctx.Done():
	}
	if err := s.dedupRedis.Start(); err != nil {
		return fmt.Errorf("restart the dedup redis: %w", err)
	}
	s.rep.RedisRestarts++
	s.rep.RedisDownS += time.Since(down).Seconds()
	s.logf("dedup redis back after %v", time.Since(down).Round(time.Millisecond))
	return nil
}

// soakEvent is a fault the soak injects once the commits reach at.
type soakEvent struct {
	at   int
	kill bool // else a Redis restart
}

// schedule draws the faults' points: kills anywhere between 10% and 90% of the
// messages, Redis restarts between 35% and 65% (mid-run).
func (s *soakRun) schedule() []soakEvent {
	var evs []soakEvent
	n := float64(s.cfg.messages)
	for range s.cfg.kills {
		evs = append(evs, soakEvent{at: int(n * (0.10 + 0.80*s.rng.Float64())), kill: true})
	}
	for range s.cfg.restarts {
		evs = append(evs, soakEvent{at: int(n * (0.35 + 0.30*s.rng.Float64()))})
	}
	slices.SortStableFunc(evs, func(a, b soakEvent) int { return a.at - b.at })
	return evs
}

// run injects the faults as the commits reach their points, and returns once every
// fault is injected and the consumer is drained (twice in a row, 100 ms apart).
func (s *soakRun) run(ctx context.Context) error {
	evs := s.schedule()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	drainedOnce := false
	lastLog := time.Now()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		for _, p := range s.live() {
			if p.exited() {
				p.wanted = true
				s.rep.ConsumerExits++
				return fmt.Errorf("consumer pid %d exited on its own: %v", p.cmd.Process.Pid, p.err)
			}
		}
		progress, err := s.ledger.Get(ctx, ledgerProgress).Int()
		if err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("ledger: %w", err)
		}
		for len(evs) > 0 && progress >= evs[0].at {
			if evs[0].kill {
				err = s.killConsumer(ctx, progress)
			} else {
				err = s.restartRedis(ctx)
			}
			if err != nil {
				return err
			}
			evs = evs[1:]
		}
		if time.Since(lastLog) >= 5*time.Second {
			lastLog = time.Now()
			s.logf("%d commits of %d messages", progress, s.cfg.messages)
		}
		if len(evs) > 0 {
			continue
		}
		drained, err := s.drained(ctx)
		if err != nil {
			return err
		}
		if drained && drainedOnce {
			return nil
		}
		drainedOnce = drained
	}
}

// drained reports whether the durable consumer has delivered every message and
// has none awaiting an ack (a Nak'ed message awaits its redelivery; a lost ack's
// message awaits AckWait).
func (s *soakRun) drained(ctx context.Context) (bool, error) {
	info, err := s.consumerInfo(ctx)
	if err != nil {
		return false, err
	}
	return info.NumPending == 0 && info.NumAckPending == 0 &&
		info.Delivered.Stream >= uint64(s.cfg.messages), nil
}

func (s *soakRun) consumerInfo(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	c, err := s.js.Consumer(ctx, s.stream, soakDurable)
	if err != nil {
		return nil, fmt.Errorf("consumer info: %w", err)
	}
	return c.Info(ctx)
}

// finish stops the consumers (SIGTERM, then SIGKILL after 15 s), then fills the
// report from the consumer's info, the ledger and the dedup records.
func (s *soakRun) finish(ctx context.Context) error {
	var errs []error
	for _, p := range s.live() {
		p.wanted = true
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range s.procs {
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
			errs = append(errs, fmt.Errorf("consumer pid %d did not stop on SIGTERM", p.cmd.Process.Pid))
		}
	}
	for _, p := range s.procs {
		if p.err != nil && !isKilled(p.err) {
			errs = append(errs, fmt.Errorf("consumer pid %d: %v", p.cmd.Process.Pid, p.err))
		}
	}
	if s.js == nil || s.ledger == nil || s.dedupRDB == nil {
		return errors.Join(errs...) // set-up failed early: nothing to count
	}
	if info, err := s.consumerInfo(ctx); err == nil {
		s.rep.Deliveries = info.Delivered.Consumer
	} else {
		errs = append(errs, err)
	}
	if err := s.readCounters(ctx); err != nil {
		errs = append(errs, err)
	}
	if s.cfg.tx {
		if err := s.countTx(ctx); err != nil {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}
	l, err := readLedger(ctx, s.ledger, s.dedupRDB, s.prefix, s.cfg.messages)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	t := l.count(s.cfg.messages)
	s.rep.Lost, s.rep.DuplicateSuccesses = t.Lost, t.DuplicateSuccesses
	s.rep.PhantomSuccesses, s.rep.UncommittedEffects = t.Phantoms, &t.Uncommitted
	s.rep.NotRecordedRepeats = t.NotRecordedRepeats
	for j := range s.rep.Kills {
		k := &s.rep.Kills[j]
		made, err := s.ledger.SMembers(ctx, procEffectsKey(k.PID)).Result()
		if err != nil {
			errs = append(errs, fmt.Errorf("ledger: %w", err))
			continue
		}
		un := l.uncommitted(made)
		k.UncommittedEffects = &un
	}
	return errors.Join(errs...)
}

// isKilled reports a process ended by the soak's own signals: a SIGKILL, or a
// SIGTERM that came before the process could catch it.
func isKilled(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && (ws.Signal() == syscall.SIGKILL || ws.Signal() == syscall.SIGTERM)
}

// readCounters sums the consumers' flushed counters and the injected faults.
func (s *soakRun) readCounters(ctx context.Context) error {
	faults, err := s.ledger.HGetAll(ctx, ledgerFaults).Result()
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	num := func(v string) int64 { n, _ := strconv.ParseInt(v, 10, 64); return n }
	s.rep.NaksInjected, s.rep.AcksDropped, s.rep.Exhausted = num(faults[faultNaks]), num(faults[faultAckDrops]), num(faults[faultExhausted])
	iter := s.ledger.Scan(ctx, 0, ledgerPrefix+":proc:*", 100).Iterator()
	for iter.Next(ctx) {
		fields, err := s.ledger.HGetAll(ctx, iter.Val()).Result()
		if err != nil {
			return fmt.Errorf("ledger: %w", err)
		}
		for k, v := range fields {
			if k != "pid" {
				s.rep.Outcomes[k] += uint64(num(v))
			}
		}
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	s.rep.StoreUnavailable = s.rep.Outcomes["store-unavailable"]
	s.rep.NotRecorded = s.rep.Outcomes["not-recorded"]
	if s.cfg.tx {
		n := s.rep.Outcomes["duplicate-database"]
		s.rep.DatabaseDuplicates = &n
	}
	return nil
}

// close kills whatever is still running (by PID) and stops the servers, in reverse
// order of their start. Idempotent.
func (s *soakRun) close() {
	for _, p := range s.procs {
		if !p.exited() {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	for _, f := range slices.Backward(s.closers) {
		f()
	}
	s.closers = nil
}
