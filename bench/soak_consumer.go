package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	dnats "github.com/dedupkit/dedupkit/nats"
	"github.com/dedupkit/dedupkit/pgxtx"
)

// A soak consumer is a process of its own (`bench soak-consumer`, started by the
// soak), so that the soak can SIGKILL it. It runs one dedup handler in Do mode on the
// soak's durable JetStream consumer through dnats.JetStream.Handler and Consume, as a
// service would, with two faults of its own: a share of the handler's runs fail (the
// adapter Naks them with backoff), and a share of the acks are silently not sent (the
// server redelivers after AckWait). It records its side effects and commits in the
// ledger (soak_ledger.go). SIGTERM (or SIGINT) stops it: it stops consuming, waits for
// the messages in hand, flushes its counters and exits 0.

// consumerConfig is what the soak tells a consumer process.
type consumerConfig struct {
	natsURL, redisAddr, ledgerAddr string
	stream, durable, prefix        string
	concurrency, buffer            int
	lease, retention               time.Duration
	nakRate, dropRate              float64
	verbose                        bool
	// the transactional variant (soak_tx.go): its database, marker and effects tables
	txDSN, txMarkers, txEffects string
}

// args renders c as the soak-consumer command line (without the subcommand).
func (c consumerConfig) args() []string {
	return []string{
		"-nats", c.natsURL, "-redis", c.redisAddr, "-ledger", c.ledgerAddr,
		"-stream", c.stream, "-durable", c.durable, "-prefix", c.prefix,
		"-concurrency", strconv.Itoa(c.concurrency), "-buffer", strconv.Itoa(c.buffer),
		"-lease", c.lease.String(), "-retention", c.retention.String(),
		"-nak-rate", strconv.FormatFloat(c.nakRate, 'g', -1, 64),
		"-drop-rate", strconv.FormatFloat(c.dropRate, 'g', -1, 64),
		"-v=" + strconv.FormatBool(c.verbose),
		"-tx-dsn", c.txDSN, "-tx-markers", c.txMarkers, "-tx-effects", c.txEffects,
	}
}

func parseConsumerFlags(args []string, stderr io.Writer) (consumerConfig, error) {
	var c consumerConfig
	fs := flag.NewFlagSet("bench soak-consumer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.natsURL, "nats", "", "NATS URL")
	fs.StringVar(&c.redisAddr, "redis", "", "the dedup Redis")
	fs.StringVar(&c.ledgerAddr, "ledger", "", "the ledger Redis")
	fs.StringVar(&c.stream, "stream", "", "JetStream stream")
	fs.StringVar(&c.durable, "durable", "", "durable consumer of the stream")
	fs.StringVar(&c.prefix, "prefix", "", "dedup key prefix")
	fs.IntVar(&c.concurrency, "concurrency", dnats.DefaultConcurrency, "messages handled at once")
	fs.IntVar(&c.buffer, "buffer", 128, "messages Consume keeps buffered")
	fs.DurationVar(&c.lease, "lease", 2*time.Second, "dedup lease")
	fs.DurationVar(&c.retention, "retention", 2*time.Hour, "dedup retention")
	fs.Float64Var(&c.nakRate, "nak-rate", 0.05, "share of handler runs that fail")
	fs.Float64Var(&c.dropRate, "drop-rate", 0.01, "share of acks not sent")
	fs.BoolVar(&c.verbose, "v", false, "log the library's warnings to stderr")
	fs.StringVar(&c.txDSN, "tx-dsn", "", "transactional variant: PostgreSQL URL")
	fs.StringVar(&c.txMarkers, "tx-markers", "", "transactional variant: marker table")
	fs.StringVar(&c.txEffects, "tx-effects", "", "transactional variant: effects table")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	case c.natsURL == "" || c.redisAddr == "" || c.ledgerAddr == "" || c.stream == "" || c.durable == "" || c.prefix == "":
		return c, errors.New("-nats, -redis, -ledger, -stream, -durable and -prefix are required")
	case c.nakRate < 0 || c.nakRate >= 1 || c.dropRate < 0 || c.dropRate >= 1:
		return c, fmt.Errorf("-nak-rate %v and -drop-rate %v must be in [0, 1)", c.nakRate, c.dropRate)
	case c.txDSN != "" && (c.txMarkers == "" || c.txEffects == ""):
		return c, errors.New("-tx-dsn needs -tx-markers and -tx-effects")
	}
	return c, nil
}

// soakStore is the consumer's dedup store: the redisstore.Store, watched. It lets the
// handler learn its claim's token (the ledger names runs by it), records each
// completion in the ledger as soon as Complete has answered, and remembers the
// completions whose DONE write failed (NotRecorded).
type soakStore struct {
	driver.Store
	ledger *redis.Client
	fatal  func(error)
	pid    int

	tokens      sync.Map // record key -> token of this process's live claim
	notRecorded sync.Map // record key -> struct{}: Complete failed; the ack follows
}

// Claim remembers an acquired claim's token for the handler. Only one run of a key
// is in hand in a process at a time (dedup's in-flight table), so the record key
// names it.
func (s *soakStore) Claim(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	as, err := s.Store.Claim(ctx, entries)
	if err == nil {
		for i, a := range as {
			if a.Err == nil && a.Status == driver.StatusAcquired {
				s.tokens.Store(entries[i].Key, entries[i].Token)
			}
		}
	}
	return as, err
}

// Complete writes the commit to the ledger once dedup has taken the run as the
// message's processing: the entry's Complete answered nil (Processed) or failed
// otherwise than with ErrLeaseLost (NotRecorded; the adapter acks it all the same).
func (s *soakStore) Complete(ctx context.Context, entries []driver.Entry) ([]error, error) {
	errs, err := s.Store.Complete(ctx, entries)
	for i, e := range entries {
		ierr := err
		if err == nil {
			ierr = errs[i]
		}
		s.completed(e.Key, e.Token, ierr)
	}
	return errs, err
}

// completed records the answer err to the completion of token's claim on key.
func (s *soakStore) completed(key, token string, err error) {
	s.tokens.Delete(key)
	if errors.Is(err, dedup.ErrLeaseLost) {
		return
	}
	if err != nil {
		s.notRecorded.Store(key, struct{}{})
	}
	i := recordIndex(key)
	if i < 0 {
		s.fatal(fmt.Errorf("completed a record key that is not the soak's"))
		return
	}
	lctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, lerr := s.ledger.Pipelined(lctx, func(p redis.Pipeliner) error {
		p.SAdd(lctx, commitKey(i), token)
		if err != nil {
			p.SAdd(lctx, notRecordedKey(i), token)
		}
		p.SRem(lctx, runKey(s.pid), runName(i, token))
		p.Incr(lctx, ledgerProgress)
		return nil
	}); lerr != nil {
		s.fatal(fmt.Errorf("ledger: record a commit: %w", lerr))
	}
}

// Release forgets each claim's token, and its run, which is no longer in hand.
func (s *soakStore) Release(ctx context.Context, entries []driver.Entry) ([]error, error) {
	for _, e := range entries {
		s.tokens.Delete(e.Key)
	}
	errs, err := s.Store.Release(ctx, entries)
	for _, e := range entries {
		i := recordIndex(e.Key)
		if i < 0 {
			continue
		}
		lctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		lerr := s.ledger.SRem(lctx, runKey(s.pid), runName(i, e.Token)).Err()
		cancel()
		if lerr != nil {
			s.fatal(fmt.Errorf("ledger: record a release: %w", lerr))
		}
	}
	return errs, err
}

// lossyMsg is a delivery whose Ack may be silently not sent, as when it is lost on
// the way: the server redelivers the message after AckWait.
type lossyMsg struct {
	jetstream.Msg
	c         *soakConsumer
	recordKey string
}

func (m lossyMsg) lose() bool {
	_, notRecorded := m.c.store.notRecorded.LoadAndDelete(m.recordKey)
	// A lost ack on top of a lost DONE write runs the message again after the lease:
	// the NotRecorded duplicate the README's Limits name. The soak injects faults dedup
	// claims to absorb, so it does not stack those two.
	if notRecorded || rand.Float64() >= m.c.cfg.dropRate {
		return false
	}
	m.c.fault(faultAckDrops)
	return true
}

// Ack implements jetstream.Msg.
func (m lossyMsg) Ack() error {
	if m.lose() {
		return nil
	}
	return m.Msg.Ack()
}

// DoubleAck implements jetstream.Msg.
func (m lossyMsg) DoubleAck(ctx context.Context) error {
	if m.lose() {
		return nil
	}
	return m.Msg.DoubleAck(ctx)
}

var errInjectedNak = errors.New("soak: injected failure")

// soakConsumer is one consumer process.
type soakConsumer struct {
	cfg    consumerConfig
	ledger *redis.Client
	store  *soakStore
	h      *dedup.Handler
	a      *dnats.JetStream
	fatal  func(error)
}

// fault counts an injected fault in the ledger.
func (c *soakConsumer) fault(field string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.ledger.HIncrBy(ctx, ledgerFaults, field, 1).Err(); err != nil {
		c.fatal(fmt.Errorf("ledger: count %s: %w", field, err))
	}
}

// start records a run as in hand and returns its message number and claim token (a
// transactional run, which claims nothing, names itself).
func (c *soakConsumer) start(ctx context.Context, m *dnats.Msg) (i int, token string, err error) {
	id := m.Header(jetstream.MsgIDHeader)
	i = soakIndex(id)
	tok, _ := c.store.tokens.Load(c.h.RecordKey(id))
	token, _ = tok.(string)
	if c.cfg.txDSN != "" {
		token = "tx-" + strconv.FormatUint(rand.Uint64(), 36)
	}
	if i < 0 || token == "" {
		c.fatal(fmt.Errorf("handler run without a soak message id or a claim token (seq %d)", m.Metadata().Sequence.Stream))
		return 0, "", errors.New("soak: bad run")
	}
	return i, token, c.ledger.SAdd(ctx, runKey(c.store.pid), runName(i, token)).Err()
}

// workTx is the transactional variant's handler: its side effect is a row in the
// transaction of its marker; a share of its runs insert it and then fail, so that
// the transaction rolls back.
func (c *soakConsumer) workTx(ctx context.Context, m *dnats.Msg, tx pgx.Tx) error {
	i, token, err := c.start(ctx, m)
	if err != nil {
		return err
	}
	defer func() { // out of hand: its transaction commits or rolls back next
		lctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if lerr := c.ledger.SRem(lctx, runKey(c.store.pid), runName(i, token)).Err(); lerr != nil {
			c.fatal(fmt.Errorf("ledger: record a run's end: %w", lerr))
		}
	}()
	if _, err := tx.Exec(ctx, "INSERT INTO "+c.cfg.txEffects+" (msg, token, pid) VALUES ($1, $2, $3)", i, token, c.store.pid); err != nil {
		return err
	}
	if rand.Float64() < c.cfg.nakRate {
		c.fault(faultNaks)
		return errInjectedNak
	}
	return nil
}

// work is the handler: it records the run as in hand, fails for a share of its runs,
// and otherwise makes its side effect, adding its claim's token to the message's set
// in the ledger (and the run to the process's, in the same transaction).
func (c *soakConsumer) work(ctx context.Context, m *dnats.Msg) error {
	i, token, err := c.start(ctx, m)
	if err != nil {
		return err
	}
	run := runName(i, token)
	if rand.Float64() < c.cfg.nakRate {
		c.fault(faultNaks)
		return errInjectedNak
	}
	_, err = c.ledger.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.SAdd(ctx, effectKey(i), token)
		p.SAdd(ctx, procEffectsKey(c.store.pid), run)
		return nil
	})
	return err
}

// flush writes the consumer's counters to soak:proc:<pid>.
func (c *soakConsumer) flush(ctx context.Context) error {
	hs, as := c.h.Stats(), c.a.Stats()
	fields := map[string]any{"pid": os.Getpid()}
	for o := dedup.Processed; o <= dedup.Cancelled; o++ {
		fields[o.String()] = hs.Count(o)
	}
	for act := dnats.ActNone; act <= dnats.ActTerm; act++ {
		fields["act-"+act.String()] = as.Count(act)
	}
	fields["ack-errors"] = as.AckErrors
	fields["duplicate-database"] = hs.DatabaseDuplicates
	return c.ledger.HSet(ctx, procKey(os.Getpid()), fields).Err()
}

// runSoakConsumer is `bench soak-consumer`: it consumes until ctx is cancelled. A
// consumer stopped while it sets up exits cleanly.
func runSoakConsumer(ctx context.Context, args []string, stderr io.Writer) error {
	cfg, err := parseConsumerFlags(args, stderr)
	if err != nil {
		return err
	}
	if err := consume(ctx, cfg, stderr); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

func consume(ctx context.Context, cfg consumerConfig, stderr io.Writer) error {
	logger := slog.New(slog.DiscardHandler)
	if cfg.verbose {
		logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	// A ledger that cannot be written makes the soak's verdict meaningless: stop here,
	// and the soak reports an unexpected exit.
	fatal := func(err error) {
		fmt.Fprintf(stderr, "soak consumer %d: %v\n", os.Getpid(), err)
		os.Exit(3)
	}

	nc, err := natsgo.Connect(cfg.natsURL, natsgo.Name("dedupkit-soak-"+strconv.Itoa(os.Getpid())))
	if err != nil {
		return fmt.Errorf("connect to nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	cons, err := js.Consumer(sctx, cfg.stream, cfg.durable)
	cancel()
	if err != nil {
		return fmt.Errorf("consumer %s: %w", cfg.durable, err)
	}

	// The README's advice for a Redis that may stall: deadlines on the socket, and a
	// read timeout well below the lease.
	rdb := redis.NewClient(&redis.Options{
		Addr: cfg.redisAddr, DialTimeout: 500 * time.Millisecond,
		ReadTimeout: time.Second, WriteTimeout: time.Second, ContextTimeoutEnabled: true,
	})
	defer rdb.Close()
	ledger := redis.NewClient(&redis.Options{Addr: cfg.ledgerAddr, PoolSize: 4 * cfg.concurrency})
	defer ledger.Close()
	rs, err := redisstore.New(rdb)
	if err != nil {
		return err
	}
	c := &soakConsumer{cfg: cfg, ledger: ledger, fatal: fatal}
	c.store = &soakStore{Store: rs, ledger: ledger, fatal: fatal, pid: os.Getpid()}
	d, err := dedup.New(c.store, dedup.WithPrefix(cfg.prefix), dedup.WithLogger(logger))
	if err != nil {
		return err
	}
	defer d.Close()
	if c.h, err = d.Register(soakHandler, dedup.WithLease(cfg.lease), dedup.WithRetention(cfg.retention)); err != nil {
		return err
	}
	c.a, err = dnats.NewJetStream(c.h, cons,
		dnats.WithConcurrency(cfg.concurrency),
		dnats.WithBackoff(func(n uint64) time.Duration { return min(time.Duration(n)*50*time.Millisecond, time.Second) }),
		dnats.WithStoreRetryDelay(250*time.Millisecond),
		dnats.WithExhausted(func(context.Context, *dnats.Msg, error) { c.fault(faultExhausted) }),
		dnats.WithLogger(logger))
	if err != nil {
		return err
	}

	// Handlers run under a context of their own: on SIGTERM the messages in hand
	// finish and are acked, rather than being cancelled.
	hctx, stopHandlers := context.WithCancel(context.Background())
	defer stopHandlers()
	handle := c.a.Handler(hctx, c.work)
	if cfg.txDSN != "" {
		pool, err := pgxpool.New(ctx, cfg.txDSN)
		if err != nil {
			return fmt.Errorf("postgres: %w", err)
		}
		defer pool.Close()
		tr, err := pgxtx.New(pool, pgxtx.WithTable(cfg.txMarkers))
		if err != nil {
			return err
		}
		defer tr.Close()
		handle = dnats.TxHandler(hctx, c.a, tr, c.workTx)
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		handle(lossyMsg{Msg: msg, c: c, recordKey: c.h.RecordKey(msg.Headers().Get(jetstream.MsgIDHeader))})
	},
		jetstream.PullMaxMessages(cfg.buffer),
		jetstream.PullHeartbeat(jsPullHeartbeat), // as scenario d: nats-io/nats.go#1622
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			logger.Warn("soak: consume", "err", err)
		}))
	if err != nil {
		return fmt.Errorf("consume: %w", err)
	}

	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil {
		select {
		case <-tick.C:
			fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if err := c.flush(fctx); err != nil && ctx.Err() == nil {
				logger.Warn("soak: flush counters", "err", err)
			}
			cancel()
		case <-ctx.Done():
		}
	}
	cc.Stop()
	<-cc.Closed()
	c.a.Wait()
	fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.flush(fctx)
}
