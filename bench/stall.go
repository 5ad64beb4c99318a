package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/embedded"
	dnats "github.com/dedupkit/dedupkit/nats"
)

// `go run ./bench stall` counts nats.go's Consume stalls (see the README's NATS notes
// and nats-io/nats.go#1622): runs in which Consume stops receiving messages with the
// stream not drained, until it reports jetstream.ErrNoHeartbeat and pulls again.
// Each run reads a stream of -messages on a new consumer, through a ModeDo handler
// with a no-op fn (-ack adapter) or with each ack sent -ack-delay after delivery and
// no dedupkit at all (-ack timer), and prints its time and whether Consume reported a
// missed heartbeat. Without -redis and -nats it uses embedded servers.

type stallConfig struct {
	redisAddr, natsURL string
	runs, messages     int
	concurrency        int
	maxAckPending      int
	heartbeat          time.Duration // 0: nats.go's default (half of PullExpiry)
	ack                string        // "adapter" or "timer"
	ackDelay           time.Duration
	timeout            time.Duration // per run
}

func parseStallFlags(args []string, stderr io.Writer) (stallConfig, error) {
	var c stallConfig
	fs := flag.NewFlagSet("bench stall", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.redisAddr, "redis", "", "Redis address (default: an embedded miniredis)")
	fs.StringVar(&c.natsURL, "nats", "", "NATS URL (default: an in-process server)")
	fs.IntVar(&c.runs, "runs", 40, "runs, each on a new consumer")
	fs.IntVar(&c.messages, "messages", 100_000, "messages in the stream; each run reads them all")
	fs.IntVar(&c.concurrency, "concurrency", 1024, "dnats.WithConcurrency of the handler (-ack adapter)")
	fs.IntVar(&c.maxAckPending, "max-ack-pending", 1000, "the consumers' MaxAckPending")
	fs.DurationVar(&c.heartbeat, "heartbeat", 0, "Consume's jetstream.PullHeartbeat (0: nats.go's default, half of PullExpiry)")
	fs.StringVar(&c.ack, "ack", "adapter", "adapter: a dnats ModeDo handler acks; timer: each ack is sent -ack-delay after delivery, without dedupkit")
	fs.DurationVar(&c.ackDelay, "ack-delay", 2*time.Millisecond, "delay of each ack (-ack timer)")
	fs.DurationVar(&c.timeout, "timeout", 2*time.Minute, "give up on a run that has not acked every message by then")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	case c.runs < 1 || c.runs > 10_000:
		return c, fmt.Errorf("-runs %d is outside 1..10000", c.runs)
	case c.messages < 1 || c.messages > 10_000_000:
		return c, fmt.Errorf("-messages %d is outside 1..10000000", c.messages)
	case c.concurrency < 1 || c.concurrency > dnats.MaxConcurrency:
		return c, fmt.Errorf("-concurrency %d is outside 1..%d", c.concurrency, dnats.MaxConcurrency)
	case c.maxAckPending < 1:
		return c, fmt.Errorf("-max-ack-pending %d is not positive", c.maxAckPending)
	case c.heartbeat != 0 && (c.heartbeat < 500*time.Millisecond || c.heartbeat > 15*time.Second):
		return c, fmt.Errorf("-heartbeat %v is outside 500ms..15s (nats.go's range, under half the default PullExpiry)", c.heartbeat)
	case c.ack != "adapter" && c.ack != "timer":
		return c, fmt.Errorf("-ack %q: want adapter or timer", c.ack)
	case c.ackDelay < 0:
		return c, fmt.Errorf("-ack-delay %v is negative", c.ackDelay)
	case c.timeout <= 0:
		return c, fmt.Errorf("-timeout %v is not positive", c.timeout)
	}
	return c, nil
}

// runStall is `bench stall`.
func runStall(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseStallFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	srv, stop, err := startServers(config{redisAddr: cfg.redisAddr, natsURL: cfg.natsURL, only: map[string]bool{"d": true}})
	if err != nil {
		return err
	}
	defer stop()
	return stall(ctx, cfg, srv, stdout)
}

// stall publishes the stream, does the runs, and prints one line per run and a total.
func stall(ctx context.Context, cfg stallConfig, srv servers, stdout io.Writer) error {
	id := runID()
	nc, err := natsgo.Connect(srv.natsURL, natsgo.Name("dedupkit-bench-stall"))
	if err != nil {
		return fmt.Errorf("connect to nats at %s: %w", srv.natsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return err
	}
	stream, subject := "DKSTALL_"+id, "dkstall."+id
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject},
		Storage: jetstream.MemoryStorage, MaxAge: time.Hour}); err != nil {
		return fmt.Errorf("create stream: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(dctx, stream)
	}()
	if err := publishMsgs(ctx, js, subject, cfg.messages); err != nil {
		return err
	}

	var dd *dedup.Deduper
	if cfg.ack == "adapter" {
		rdb := redis.NewClient(&redis.Options{Addr: srv.redisAddr})
		defer rdb.Close()
		prefix := "dkstall-" + id
		defer func() {
			dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_ = embedded.DeleteKeys(dctx, rdb, prefix)
		}()
		st, err := redisstore.New(rdb)
		if err != nil {
			return err
		}
		if dd, err = dedup.New(st, dedup.WithPrefix(prefix)); err != nil {
			return err
		}
		defer dd.Close()
	}

	fmt.Fprintf(stdout, "nats-server %s; %d messages per run; -ack %s, -concurrency %d, -max-ack-pending %d, -heartbeat %v\n",
		nc.ConnectedServerVersion(), cfg.messages, cfg.ack, cfg.concurrency, cfg.maxAckPending, cfg.heartbeat)
	stalls := 0
	for r := range cfg.runs {
		took, missed, err := stallRun(ctx, cfg, js, dd, stream, r)
		if err != nil {
			return fmt.Errorf("run %d: %w", r+1, err)
		}
		mark := ""
		if missed {
			stalls++
			mark = "  STALL (Consume reported a missed heartbeat)"
		}
		fmt.Fprintf(stdout, "run %d: %v, %.0f msg/s%s\n", r+1, took.Round(time.Millisecond), float64(cfg.messages)/took.Seconds(), mark)
	}
	fmt.Fprintf(stdout, "stalls: %d of %d runs\n", stalls, cfg.runs)
	return nil
}

// stallRun reads the stream once on a new consumer; missed says whether Consume
// reported jetstream.ErrNoHeartbeat meanwhile.
func stallRun(ctx context.Context, cfg stallConfig, js jetstream.JetStream, dd *dedup.Deduper, stream string, r int) (took time.Duration, missed bool, err error) {
	rctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	durable := fmt.Sprintf("stall-r%d", r)
	cons, err := js.CreateConsumer(rctx, stream, jetstream.ConsumerConfig{Durable: durable,
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: jsAckWait, MaxDeliver: jsMaxDeliver, MaxAckPending: cfg.maxAckPending})
	if err != nil {
		return 0, false, fmt.Errorf("create consumer: %w", err)
	}
	defer func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer dcancel()
		_ = js.DeleteConsumer(dctx, stream, durable)
	}()
	t := &tally{want: int64(cfg.messages), done: make(chan struct{})}
	handle, wait := func(m jetstream.Msg) { time.AfterFunc(cfg.ackDelay, func() { _ = m.Ack() }) }, func() {}
	if dd != nil {
		h, err := dd.Register(durable, dedup.WithMode(dedup.ModeDo), dedup.WithRetention(retention))
		if err != nil {
			return 0, false, err
		}
		a, err := dnats.NewJetStream(h, cons, dnats.WithConcurrency(cfg.concurrency))
		if err != nil {
			return 0, false, err
		}
		handle, wait = a.Handler(rctx, func(context.Context, *dnats.Msg) error { return nil }), a.Wait
	}
	var noHeartbeat atomic.Bool
	opts := []jetstream.PullConsumeOpt{jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if errors.Is(err, jetstream.ErrNoHeartbeat) {
			noHeartbeat.Store(true)
		}
	})}
	if cfg.heartbeat > 0 {
		opts = append(opts, jetstream.PullHeartbeat(cfg.heartbeat))
	}
	start := time.Now()
	cc, err := cons.Consume(func(msg jetstream.Msg) { handle(countedMsg{msg, t}) }, opts...)
	if err != nil {
		return 0, false, fmt.Errorf("consume: %w", err)
	}
	select {
	case <-t.done:
	case <-rctx.Done():
	}
	took = time.Since(start)
	cc.Stop()
	<-cc.Closed()
	wait()
	if err := rctx.Err(); err != nil {
		return 0, false, fmt.Errorf("%d of %d messages acked: %w", t.acks.Load(), t.want, err)
	}
	return took, noHeartbeat.Load(), nil
}
