// Command core-nats shows filter mode on a plain core NATS subscription: a handler
// registered with dedup.WithMode(dedup.ModeFilter), wrapped with nats.NewCore, runs
// behind queue subscribers (each its own connection and dedup.Deduper, as separate
// processes would be, sharing one Redis). Events are published with a Nats-Msg-Id,
// some ids two or three times; the first sighting of an id runs the handler, later
// ones are dropped, whichever subscriber gets them.
//
// Core NATS has no acks and no redelivery, so filter mode (one store round trip, no
// lease) suits side effects that are cheap to lose on a crash: metrics, caches,
// fan-out. The program exits non-zero unless every id ran exactly once. Bare, it runs
// on in-process servers; on real ones it deletes its records at exit.
//
//	go run ./examples/core-nats
//	go run ./examples/core-nats -nats nats://127.0.0.1:4222 -redis 127.0.0.1:6379
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/dedupkittest"
	dnats "github.com/dedupkit/dedupkit/nats"
)

func main() {
	ctx, _ := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM) // ends the run at ^C
	if _, err := run(ctx, os.Args[1:], os.Stdout); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "core-nats:", err)
		os.Exit(1)
	}
}

// result is what the subscribers did, for the tests.
type result struct {
	handlers []*dedup.Handler // one per subscriber
	ran      []atomic.Int32   // side effects per event id: each must end at 1
	sent     int              // messages published
}

// handled is how many messages the subscribers' handlers have answered.
func (r *result) handled() (n uint64) {
	for _, h := range r.handlers {
		for o := dedup.Processed; o <= dedup.Cancelled; o++ {
			n += h.Stats().Count(o)
		}
	}
	return n
}

func run(ctx context.Context, args []string, stdout io.Writer) (*result, error) {
	fs := flag.NewFlagSet("core-nats", flag.ContinueOnError)
	natsURL := fs.String("nats", os.Getenv("DEDUP_NATS_URL"), "NATS URL (default: in-process; env DEDUP_NATS_URL)")
	redisAddr := fs.String("redis", os.Getenv("DEDUP_REDIS_ADDR"), "Redis address (default: embedded; env DEDUP_REDIS_ADDR)")
	events := fs.Int("events", 3000, "distinct event ids to publish")
	subscribers := fs.Int("subscribers", 2, "queue subscribers, each its own connection and Deduper")
	timeout := fs.Duration("timeout", 25*time.Second, "give up if not every event has arrived by then")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 || *events < 1 || *subscribers < 1 || *timeout <= 0 {
		return nil, cmp.Or(err, errors.New("want positive -events, -subscribers and -timeout, and no arguments"))
	}
	srv, err := dedupkittest.StartServers(*natsURL, *redisAddr)
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	// A subject, queue group and Redis key prefix of this run's own.
	id := strings.ToLower(rand.Text()[:8])
	subject, queue, prefix := "dedupkit.example."+id+".events", "dedupkit-example-"+id, "dedupkit-core-"+id
	fmt.Fprintf(stdout, "run %s on %s\n", id, srv)
	rdb := redis.NewClient(&redis.Options{Addr: srv.RedisAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	defer dedupkittest.DeleteKeys(context.Background(), rdb, prefix) // SCAN and UNLINK, never FLUSHDB
	store, err := redisstore.New(rdb)
	if err != nil {
		return nil, err
	}

	// The side effect: count the event. It runs on the first sighting of its id only.
	res := &result{ran: make([]atomic.Int32, *events)}
	count := func(_ context.Context, m *dnats.Msg) error {
		i, err := strconv.Atoi(m.Header(natsgo.MsgIdHdr))
		if err != nil || i < 0 || i >= len(res.ran) {
			return errors.New("not an event id of this run")
		}
		res.ran[i].Add(1)
		return nil
	}
	for range *subscribers {
		d, err := dedup.New(store, dedup.WithPrefix(prefix))
		if err != nil {
			return nil, err
		}
		defer d.Close()
		h, err := d.Register("page-views", dedup.WithMode(dedup.ModeFilter), dedup.WithRetention(time.Hour))
		if err != nil {
			return nil, err
		}
		core, err := dnats.NewCore(h)
		if err != nil {
			return nil, err
		}
		nc, err := natsgo.Connect(srv.NATSURL)
		if err != nil {
			return nil, err
		}
		defer func() { nc.Close(); core.Wait() }() // Wait: the handler runs messages on goroutines of its own
		if _, err := nc.QueueSubscribe(subject, queue, core.Handler(ctx, count)); err != nil {
			return nil, err
		}
		if err := nc.Flush(); err != nil { // the server has the subscription before anything is published
			return nil, err
		}
		res.handlers = append(res.handlers, h)
	}

	// Every id once, 30% of them once or twice more, in random order.
	var sends []int
	for i := range *events {
		sends = append(sends, i)
		if mrand.Float64() < 0.3 {
			sends = append(sends, slices.Repeat([]int{i}, 1+mrand.IntN(2))...)
		}
	}
	mrand.Shuffle(len(sends), func(i, j int) { sends[i], sends[j] = sends[j], sends[i] })
	pub, err := natsgo.Connect(srv.NATSURL)
	if err != nil {
		return nil, err
	}
	defer pub.Close()
	for _, i := range sends {
		msg := natsgo.NewMsg(subject)
		msg.Header.Set(natsgo.MsgIdHdr, strconv.Itoa(i))
		msg.Data = fmt.Appendf(nil, `{"event":"page-view","n":%d}`, i)
		if err := pub.PublishMsg(msg); err != nil {
			return nil, err
		}
	}
	if err := pub.FlushTimeout(10 * time.Second); err != nil {
		return nil, err
	}
	res.sent = len(sends)

	// Core NATS does not redeliver: wait until every message has been handled.
	for deadline := time.Now().Add(*timeout); res.handled() < uint64(len(sends)); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return res, fmt.Errorf("%d of %d messages handled before the timeout", res.handled(), len(sends))
		}
	}
	for i := range res.ran {
		if n := res.ran[i].Load(); n != 1 {
			return res, fmt.Errorf("event %d ran %d times", i, n)
		}
	}
	fmt.Fprintf(stdout, "ok: each of %d ids ran exactly once; %d repeats dropped as duplicates\n", *events, len(sends)-*events)
	return res, nil
}
