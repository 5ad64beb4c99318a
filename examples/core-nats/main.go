// Command core-nats shows filter mode on a plain core NATS subscription: a dedup
// handler registered with dedup.WithMode(dedup.ModeFilter), wrapped with nats.NewCore,
// runs behind two queue subscribers (each its own connection and dedup.Deduper, as
// separate processes would be, sharing one Redis). Events are published with a
// Nats-Msg-Id header, and some ids are published two or three times; the first
// sighting of an id runs the handler, later ones are dropped, whichever subscriber
// gets them.
//
// Core NATS has no acks and no redelivery, so filter mode (one store round trip, no
// lease) suits side effects that are cheap to lose on a crash: metrics, caches,
// fan-out. The program prints how many events ran and how many were dropped as
// duplicates, and exits non-zero if an id ran twice or a unique id never ran.
//
// With no flags it starts an in-process NATS server and miniredis. -nats and -redis (or
// DEDUP_NATS_URL and DEDUP_REDIS_ADDR) point it at real servers; it then uses subjects
// and a Redis key prefix of its own and deletes its records at exit.
//
//	go run ./examples/core-nats
//	go run ./examples/core-nats -nats nats://127.0.0.1:4222 -redis 127.0.0.1:6379
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/internal/embedded"
	dnats "github.com/dedupkit/dedupkit/nats"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "core-nats:", err)
		os.Exit(1)
	}
}

// repeatShare of the ids are published more than once (two or three times).
const repeatShare = 0.3

type config struct {
	natsURL, redisAddr string
	events             int
	subscribers        int
	timeout            time.Duration
	verbose            bool
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("core-nats", flag.ContinueOnError)
	fs.StringVar(&c.natsURL, "nats", os.Getenv("DEDUP_NATS_URL"), "NATS URL (default: an in-process server; env DEDUP_NATS_URL)")
	fs.StringVar(&c.redisAddr, "redis", os.Getenv("DEDUP_REDIS_ADDR"), "Redis address (default: an embedded miniredis; env DEDUP_REDIS_ADDR)")
	fs.IntVar(&c.events, "events", 3000, "distinct event ids to publish")
	fs.IntVar(&c.subscribers, "subscribers", 2, "queue subscribers (each its own Deduper and connection)")
	fs.DurationVar(&c.timeout, "timeout", 25*time.Second, "give up if not every event has arrived by then")
	fs.BoolVar(&c.verbose, "v", false, "log the library's warnings and errors to stderr (keys appear hashed)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	case c.events < 1 || c.events > 99999:
		return c, fmt.Errorf("-events %d is outside 1..99999", c.events)
	case c.subscribers < 1 || c.subscribers > 32:
		return c, fmt.Errorf("-subscribers %d is outside 1..32", c.subscribers)
	case c.timeout <= 0:
		return c, fmt.Errorf("-timeout %v is not positive", c.timeout)
	}
	return c, nil
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	cfg, err := parseFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	logger := slog.New(slog.DiscardHandler)
	if cfg.verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	id := hex.EncodeToString(b[:])
	subject := "dedupkit.example." + id + ".events"
	queue := "dedupkit-example-" + id
	prefix := "dedupkit-core-" + id
	fmt.Fprintln(stdout, "run", id)

	natsURL, stopNATS, err := startNATS(cfg.natsURL, stdout)
	if err != nil {
		return err
	}
	defer stopNATS()
	redisAddr, stopRedis, err := startRedis(cfg.redisAddr, stdout)
	if err != nil {
		return err
	}
	defer stopRedis()
	defer deletePrefix(redisAddr, prefix)
	fmt.Fprintf(stdout, "subject %s, queue group %s, redis key prefix %s\n\n", subject, queue, prefix)

	ran := make([]atomic.Int32, cfg.events)
	subs := make([]*subscriber, 0, cfg.subscribers)
	defer func() {
		for _, s := range subs {
			s.close()
		}
	}()
	for i := range cfg.subscribers {
		s, err := subscribe(ctx, i+1, natsURL, redisAddr, subject, queue, prefix, logger, ran)
		if err != nil {
			return fmt.Errorf("subscriber %d: %w", i+1, err)
		}
		subs = append(subs, s)
	}

	// Every id once, 30% of them once or twice more, in random order.
	var sends []int
	for i := range cfg.events {
		sends = append(sends, i)
	}
	for _, i := range mrand.Perm(cfg.events)[:int(repeatShare*float64(cfg.events))] {
		for range 1 + mrand.IntN(2) {
			sends = append(sends, i)
		}
	}
	mrand.Shuffle(len(sends), func(i, j int) { sends[i], sends[j] = sends[j], sends[i] })

	pub, err := natsgo.Connect(natsURL, natsgo.Name("dedupkit-example-publisher"))
	if err != nil {
		return fmt.Errorf("connect to nats: %w", err)
	}
	defer pub.Close()
	start := time.Now()
	for _, i := range sends {
		msg := natsgo.NewMsg(subject)
		msg.Header.Set(natsgo.MsgIdHdr, eventID(i))
		msg.Data = []byte(`{"event":"page-view","n":` + strconv.Itoa(i) + `}`)
		if err := pub.PublishMsg(msg); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
	}
	if err := pub.FlushTimeout(10 * time.Second); err != nil {
		return fmt.Errorf("flush: %w", err)
	}

	// Core NATS does not redeliver: wait until every message has been handled.
	waitCtx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	handled := func() uint64 {
		var n uint64
		for _, s := range subs {
			n += s.handled()
		}
		return n
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var waitErr error
	for handled() < uint64(len(sends)) && waitErr == nil {
		select {
		case <-tick.C:
		case <-waitCtx.Done():
			waitErr = fmt.Errorf("%d of %d messages handled: %w", handled(), len(sends), waitCtx.Err())
		}
	}
	elapsed := time.Since(start)

	// Drain the subscriptions, then close the Dedupers, before reading the counters.
	for _, s := range subs {
		s.close()
	}

	fmt.Fprintf(stdout, "published  %6d messages: %d distinct ids, %d repeats, in %.2fs\n\n",
		len(sends), cfg.events, len(sends)-cfg.events, elapsed.Seconds())
	fmt.Fprintf(stdout, "%-12s %8s %6s %9s %10s %10s %7s\n", "subscriber", "received", "ran", "dropped", "dup-local", "dup-redis", "other")
	var total, totalRan, totalDropped, totalLocal, totalStore, totalOther uint64
	for _, s := range subs {
		st := s.h.Stats()
		recv, other := s.handled(), s.other()
		row(stdout, fmt.Sprintf("%d", s.n), recv, st.Count(dedup.Processed), st.Count(dedup.Duplicate), st.LocalDuplicates, st.StoreDuplicates, other)
		total += recv
		totalRan += st.Count(dedup.Processed)
		totalDropped += st.Count(dedup.Duplicate)
		totalLocal += st.LocalDuplicates
		totalStore += st.StoreDuplicates
		totalOther += other
	}
	row(stdout, "total", total, totalRan, totalDropped, totalLocal, totalStore, totalOther)
	fmt.Fprintln(stdout)
	if waitErr != nil {
		return waitErr
	}

	var never, twice int
	for i := range ran {
		switch n := ran[i].Load(); {
		case n == 0:
			never++
		case n > 1:
			twice++
		}
	}
	if never > 0 || twice > 0 || totalOther > 0 {
		return fmt.Errorf("%d ids never ran, %d ran more than once, %d messages neither ran nor were duplicates", never, twice, totalOther)
	}
	fmt.Fprintf(stdout, "ok: each of %d ids ran exactly once; %d repeats dropped as duplicates\n", cfg.events, totalDropped)
	return nil
}

func row(w io.Writer, name string, recv, ran, dropped, local, store, other uint64) {
	fmt.Fprintf(w, "%-12s %8d %6d %9d %10d %10d %7d\n", name, recv, ran, dropped, local, store, other)
}

func eventID(i int) string { return fmt.Sprintf("evt-%05d", i) }

// subscriber is one consumer instance: its own connection, Deduper and Redis client.
type subscriber struct {
	n      int
	nc     *natsgo.Conn
	closed chan struct{} // closed once nc has drained and closed
	rdb    *redis.Client
	d      *dedup.Deduper
	h      *dedup.Handler
	core   *dnats.Core
	done   bool
}

func subscribe(ctx context.Context, n int, natsURL, redisAddr, subject, queue, prefix string, logger *slog.Logger, ran []atomic.Int32) (*subscriber, error) {
	s := &subscriber{n: n, closed: make(chan struct{})}
	s.rdb = redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	store, err := dedup.NewRedisStore(s.rdb)
	if err != nil {
		s.rdb.Close()
		return nil, err
	}
	if s.d, err = dedup.New(store, dedup.WithPrefix(prefix), dedup.WithLogger(logger)); err != nil {
		s.rdb.Close()
		return nil, err
	}
	if s.h, err = s.d.Register("page-views", dedup.WithMode(dedup.ModeFilter), dedup.WithRetention(time.Hour)); err != nil {
		s.d.Close()
		s.rdb.Close()
		return nil, err
	}
	core, err := dnats.NewCore(s.h, dnats.WithLogger(logger))
	s.core = core
	if err != nil {
		s.d.Close()
		s.rdb.Close()
		return nil, err
	}
	s.nc, err = natsgo.Connect(natsURL, natsgo.Name(fmt.Sprintf("dedupkit-example-%d", n)),
		natsgo.ClosedHandler(func(*natsgo.Conn) { close(s.closed) }))
	if err != nil {
		s.d.Close()
		s.rdb.Close()
		return nil, fmt.Errorf("connect to nats: %w", err)
	}
	// The side effect: count the event. It runs on the first sighting of its id only.
	count := func(_ context.Context, m *dnats.Msg) error {
		i, err := strconv.Atoi(strings.TrimPrefix(m.Header(natsgo.MsgIdHdr), "evt-"))
		if err != nil || i < 0 || i >= len(ran) {
			return errors.New("not one of our event ids")
		}
		ran[i].Add(1)
		return nil
	}
	if _, err := s.nc.QueueSubscribe(subject, queue, core.Handler(ctx, count)); err != nil {
		s.close()
		return nil, err
	}
	// Make sure the server has the subscription before anything is published.
	if err := s.nc.Flush(); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// handled is how many messages this subscriber's handler has answered.
func (s *subscriber) handled() uint64 {
	st := s.h.Stats()
	var n uint64
	for o := dedup.Processed; o <= dedup.Cancelled; o++ {
		n += st.Count(o)
	}
	return n
}

// other is how many messages ended neither as a run nor as a duplicate.
func (s *subscriber) other() uint64 {
	st := s.h.Stats()
	return s.handled() - st.Count(dedup.Processed) - st.Count(dedup.Duplicate)
}

// close drains the subscription and waits for the handlers in flight, then closes the
// Deduper and the Redis client. Idempotent; not safe for concurrent use.
func (s *subscriber) close() {
	if s.done {
		return
	}
	s.done = true
	if err := s.nc.Drain(); err == nil {
		<-s.closed
	} else {
		s.nc.Close()
	}
	if s.core != nil {
		s.core.Wait() // the Handler runs messages on goroutines of its own
	}
	s.d.Close()
	s.rdb.Close()
}

// startNATS returns url's server, or an in-process one storing in a temp dir.
func startNATS(url string, stdout io.Writer) (string, func(), error) {
	if url != "" {
		fmt.Fprintln(stdout, "nats:", url)
		return url, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "dedupkit-core-nats-")
	if err != nil {
		return "", nil, err
	}
	srv, err := embedded.StartNATS(dir)
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	fmt.Fprintln(stdout, "nats: in-process server at", srv.URL())
	return srv.URL(), func() {
		srv.Close()
		os.RemoveAll(dir)
	}, nil
}

// startRedis returns addr, or an embedded miniredis.
func startRedis(addr string, stdout io.Writer) (string, func(), error) {
	if addr != "" {
		fmt.Fprintln(stdout, "redis:", addr)
		return addr, func() {}, nil
	}
	srv, err := embedded.StartRedis()
	if err != nil {
		return "", nil, err
	}
	fmt.Fprintln(stdout, "redis: embedded miniredis at", srv.Addr())
	return srv.Addr(), srv.Close, nil
}

// deletePrefix removes this run's records: SCAN and UNLINK, never FLUSHDB on a
// shared Redis.
func deletePrefix(addr, prefix string) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := embedded.DeleteKeys(ctx, rdb, prefix); err != nil {
		fmt.Fprintln(os.Stderr, "core-nats: delete redis records:", err)
	}
}
