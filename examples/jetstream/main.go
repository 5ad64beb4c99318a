// Command jetstream is dedupkit's main job: orders from a JetStream stream run through
// a "reserve-stock" handler in several instances sharing one Redis, with the duplicates
// JetStream makes (publisher retries, failed or panicking runs, consumers crashing
// between work and ack). It exits non-zero unless every order ran exactly once. Bare,
// it runs on in-process servers; on real ones it deletes its stream and records at exit.
//
//	go run ./examples/jetstream
//	go run ./examples/jetstream -nats nats://127.0.0.1:4222 -redis 127.0.0.1:6379
//	go run ./examples/jetstream -redis-cluster 127.0.0.1:7000,127.0.0.1:7001
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/dedupkittest"
	dnats "github.com/dedupkit/dedupkit/nats"
)

func main() {
	ctx, _ := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM) // ends the run at ^C
	if _, err := run(ctx, os.Args[1:], os.Stdout); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "jetstream:", err)
		os.Exit(1)
	}
}

// run runs the job and returns what happened, for the tests.
func run(ctx context.Context, args []string, stdout io.Writer) (*tally, error) {
	fs := flag.NewFlagSet("jetstream", flag.ContinueOnError)
	natsURL := fs.String("nats", os.Getenv("DEDUP_NATS_URL"), "NATS URL (default: in-process; env DEDUP_NATS_URL)")
	redisAddr := fs.String("redis", "", "Redis address (default: env DEDUP_REDIS_ADDR, else embedded)")
	cluster := fs.String("redis-cluster", "", "seed nodes of a Redis Cluster, host:port,... (instead of -redis)")
	orders := fs.Int("orders", 3000, "orders to publish")
	instances := fs.Int("instances", 3, "consumer instances")
	timeout := fs.Duration("timeout", 25*time.Second, "give up if the orders have not all run by then")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 || *orders < 1 || *instances < 1 || *timeout <= 0 ||
		*cluster != "" && (*redisAddr != "" || slices.Contains(strings.Split(*cluster, ","), "")) {
		return nil, cmp.Or(err, errors.New("want positive -orders, -instances, -timeout, -redis-cluster host:port,... without -redis, no arguments"))
	}
	srv, err := dedupkittest.StartServers(*natsURL, cmp.Or(*cluster, *redisAddr, os.Getenv("DEDUP_REDIS_ADDR")))
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	rdb := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: strings.Split(srv.RedisAddr, ","),
		IsClusterMode: *cluster != "", ContextTimeoutEnabled: true})
	defer rdb.Close()
	nc, err := natsgo.Connect(srv.NATSURL)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}

	// A stream and a Redis key prefix of this run's own, deleted at exit.
	id := strings.ToLower(rand.Text()[:8])
	stream, subject, prefix := "DEDUPKIT_EX_"+strings.ToUpper(id), "dedupkit.example."+id+".orders", "dedupkit-ex-"+id
	fmt.Fprintf(stdout, "run %s on %s\n", id, srv)
	// A short duplicate window and AckWait, so that retries and lost acks come soon.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject},
		Storage: jetstream.MemoryStorage, Duplicates: 200 * time.Millisecond, MaxAge: time.Hour}); err != nil {
		return nil, err
	}
	defer js.DeleteStream(context.Background(), stream)
	defer dedupkittest.DeleteKeys(context.Background(), rdb, prefix) // SCAN and UNLINK, never FLUSHDB

	// The instances, as separate processes would be: each a Deduper and a consumer.
	t := &tally{effects: make([]atomic.Int32, *orders)}
	quiet := slog.New(slog.DiscardHandler) // the injected panics would fill the log
	store, err := redisstore.New(rdb)
	if err != nil {
		return nil, err
	}
	if t.consumer, err = js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "reserve-stock",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second, MaxDeliver: 10}); err != nil {
		return nil, err
	}
	for range *instances {
		d, err := dedup.New(store, dedup.WithPrefix(prefix), dedup.WithLogger(quiet))
		if err != nil {
			return nil, err
		}
		defer d.Close()
		// The lease bounds how long a stalled instance keeps an order from the others.
		h, err := d.Register("reserve-stock", dedup.WithRetention(72*time.Hour), dedup.WithLease(5*time.Second))
		if err != nil {
			return nil, err
		}
		a, err := dnats.NewJetStream(h, t.consumer, dnats.WithLogger(quiet))
		if err != nil {
			return nil, err
		}
		t.handlers, t.adapters = append(t.handlers, h), append(t.adapters, a)
		handle := a.Handler(ctx, t.work)
		cc, err := t.consumer.Consume(func(msg jetstream.Msg) { handle(t.deliver(msg)) }, jetstream.PullHeartbeat(time.Second))
		if err != nil {
			return nil, err
		}
		defer func() { cc.Stop(); <-cc.Closed(); a.Wait() }()
	}

	// Publish every order, then the first tenth again, as a publisher that retries
	// after the stream's duplicate window has passed: the stream stores them twice.
	for i := range *orders + *orders/10 {
		if i == *orders {
			time.Sleep(400 * time.Millisecond)
		}
		msg := natsgo.NewMsg(subject)
		msg.Header.Set(jetstream.MsgIDHeader, strconv.Itoa(i%*orders)) // the order id
		msg.Data = fmt.Appendf(nil, `{"order":%d,"sku":"sku-%03d","qty":%d}`, i%*orders, i%97, 1+i%5)
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			return nil, err
		}
	}

	// Wait until every order has run and no message is pending or awaiting its ack;
	// then each order must have run exactly once.
	deadline := time.Now().Add(*timeout)
	for t.info == nil || t.info.NumPending+uint64(t.info.NumAckPending) > 0 || t.done.Load() < int64(*orders) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return t, fmt.Errorf("%d of %d orders ran before the timeout", t.done.Load(), *orders)
		}
		time.Sleep(50 * time.Millisecond)
		t.info, _ = t.consumer.Info(ctx)
	}
	for seq := range t.effects {
		if n := t.effects[seq].Load(); n != 1 {
			return t, fmt.Errorf("order %d ran %d times", seq, n)
		}
	}
	fmt.Fprintf(stdout, "ok: each of %d orders ran exactly once (%d messages stored, %d deliveries, %d handler runs counting the injected failures and panics, %d crashes before an ack)\n",
		*orders, t.info.Delivered.Stream, t.info.Delivered.Consumer, t.runs.Load(), t.crashes.Load())
	return t, nil
}

// tally is what happened to the orders, across the instances.
type tally struct {
	consumer            jetstream.Consumer
	info                *jetstream.ConsumerInfo // the last one read
	effects             []atomic.Int32          // side effects per order: each must end at 1
	done, runs, crashes atomic.Int64            // side effects, runs of work, crashes before an ack
	handlers            []*dedup.Handler        // one per instance, for the tests
	adapters            []*dnats.JetStream
}

// work is the handler's side effect (reserving the stock), counted. The first
// delivery of every 30th order fails, of another 30th panics: both come again.
func (t *tally) work(_ context.Context, m *dnats.Msg) error {
	seq, _ := strconv.Atoi(m.Header(jetstream.MsgIDHeader))
	t.runs.Add(1)
	switch first := m.NumDelivered() == 1; {
	case first && seq%30 == 1:
		return errors.New("injected failure")
	case first && seq%30 == 2:
		panic("injected panic")
	}
	t.effects[seq].Add(1)
	t.done.Add(1)
	return nil
}

// deliver makes the consumer "crash" after the work on the first delivery of every
// 30th order: its ack never reaches the server, which redelivers the order.
func (t *tally) deliver(msg jetstream.Msg) jetstream.Msg {
	seq, _ := strconv.Atoi(msg.Headers().Get(jetstream.MsgIDHeader))
	if md, err := msg.Metadata(); err == nil && md.NumDelivered == 1 && seq%30 == 3 {
		t.crashes.Add(1)
		return crashBeforeAck{msg}
	}
	return msg
}

// crashBeforeAck is a delivery whose Ack is lost.
type crashBeforeAck struct{ jetstream.Msg }

func (crashBeforeAck) Ack() error { return nil }
