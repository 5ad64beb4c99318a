// Command request-reply shows an idempotent NATS service: a nats.go/micro endpoint
// served by dnats's Replier over a handler that stores replies (dedup.WithReplies),
// in two instances sharing one Redis, and clients that retry: after a timeout (a slow
// first run), a lost reply, or a 503 from the instance not running the request. Every
// retry gets the first run's reply back, byte for byte; it exits non-zero unless every
// request created exactly one order. Bare, it runs on in-process servers; on real
// ones it deletes its records at exit.
//
//	go run ./examples/request-reply
//	go run ./examples/request-reply -nats nats://127.0.0.1:4222 -redis 127.0.0.1:6379
package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/dedupkittest"
	dnats "github.com/dedupkit/dedupkit/nats"
)

func main() {
	ctx, _ := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM) // ends the run at ^C
	if _, err := run(ctx, os.Args[1:], os.Stdout); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "request-reply:", err)
		os.Exit(1)
	}
}

// requestTimeout is how long a client waits for an answer before it retries.
const requestTimeout = 150 * time.Millisecond

// result is what the service and the clients did, for the tests.
type result struct {
	repliers                []*dnats.Replier // one per instance
	created                 []atomic.Int32   // orders created per request: each must end at 1
	timeouts, lost, retries atomic.Int64     // attempts that timed out, replies lost, 503s
	differentAnswer         atomic.Int64     // retries not answered with the first reply
}

func run(ctx context.Context, args []string, stdout io.Writer) (*result, error) {
	fs := flag.NewFlagSet("request-reply", flag.ContinueOnError)
	natsURL := fs.String("nats", os.Getenv("DEDUP_NATS_URL"), "NATS URL (default: in-process; env DEDUP_NATS_URL)")
	redisAddr := fs.String("redis", os.Getenv("DEDUP_REDIS_ADDR"), "Redis address (default: embedded; env DEDUP_REDIS_ADDR)")
	requests := fs.Int("requests", 200, "create-order requests, each with an Idempotency-Key of its own")
	clients := fs.Int("clients", 16, "clients sending requests at once")
	timeout := fs.Duration("timeout", 60*time.Second, "give up if the requests are not all answered by then")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 || *requests < 1 || *clients < 1 || *timeout <= 0 {
		return nil, cmp.Or(err, errors.New("want positive -requests, -clients and -timeout, and no arguments"))
	}
	srv, err := dedupkittest.StartServers(*natsURL, *redisAddr)
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	id := strings.ToLower(rand.Text()[:8]) // a subject and key prefix of this run's own
	subject, prefix := "dedupkit.example."+id+".orders.create", "dedupkit-rr-"+id
	fmt.Fprintf(stdout, "run %s on %s\n", id, srv)
	rdb := redis.NewClient(&redis.Options{Addr: srv.RedisAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	defer dedupkittest.DeleteKeys(context.Background(), rdb, prefix) // SCAN and UNLINK, never FLUSHDB
	store, err := redisstore.New(rdb)
	if err != nil {
		return nil, err
	}

	// The endpoint's work: create the order. Every 10th request is slower than the
	// client waits, so that the client retries while it runs.
	res := &result{created: make([]atomic.Int32, *requests)}
	createOrder := func(ctx context.Context, m *dnats.Msg) (dnats.Reply, error) {
		req, err := strconv.Atoi(m.Header("Idempotency-Key"))
		if err != nil || req < 0 || req >= len(res.created) {
			return dnats.Reply{}, &dnats.ServiceError{Code: "400", Description: "unknown request"}
		}
		if req%10 == 0 {
			time.Sleep(2 * requestTimeout)
		}
		order := fmt.Sprintf("o-%d-%d", req, res.created[req].Add(1))
		return dnats.Reply{Header: natsgo.Header{"Order-Id": {order}}, Data: fmt.Appendf(nil, `{"order_id":%q}`, order)}, nil
	}
	for range 2 { // two instances of the service
		d, err := dedup.New(store, dedup.WithPrefix(prefix))
		if err != nil {
			return nil, err
		}
		defer d.Close()
		// Replies up to 64 KiB, kept as long as the requests' idempotency window.
		h, err := d.Register("create-order", dedup.WithReplies(0), dedup.WithRetention(time.Hour))
		if err != nil {
			return nil, err
		}
		replier, err := dnats.NewReplier(h)
		if err != nil {
			return nil, err
		}
		nc, err := natsgo.Connect(srv.NATSURL)
		if err != nil {
			return nil, err
		}
		defer nc.Close()
		svc, err := micro.AddService(nc, micro.Config{Name: "orders", Version: "1.0.0"})
		if err != nil {
			return nil, err
		}
		defer func() { svc.Stop(); replier.Wait() }()
		// The idempotent endpoint: one line.
		if err := svc.AddEndpoint("create", replier.MicroHandler(ctx, createOrder), micro.WithEndpointSubject(subject)); err != nil {
			return nil, err
		}
		res.repliers = append(res.repliers, replier)
	}

	// The clients, each sending requests until they are all answered.
	nc, err := natsgo.Connect(srv.NATSURL)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	runCtx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range *clients {
		wg.Go(func() {
			for req := int(next.Add(1) - 1); req < *requests && runCtx.Err() == nil; req = int(next.Add(1) - 1) {
				call(runCtx, nc, subject, req, res)
			}
		})
	}
	wg.Wait()
	if err := runCtx.Err(); err != nil {
		return res, fmt.Errorf("not every request answered: %w", err)
	}
	for req := range res.created {
		if n := res.created[req].Load(); n != 1 || res.differentAnswer.Load() > 0 {
			return res, fmt.Errorf("request %d created %d orders; %d retries got another reply than the first", req, n, res.differentAnswer.Load())
		}
	}
	fmt.Fprintf(stdout, "ok: each of %d requests created exactly one order; %d attempts timed out, %d lost their reply, %d got a 503\n",
		*requests, res.timeouts.Load(), res.lost.Load(), res.retries.Load())
	return res, nil
}

// call sends request req until it is answered, as a client that retries does: after
// a timeout, after giving up on a reply, and after a 503 (waiting what it says). A
// request whose first attempt went wrong is asked once more, to see the same reply.
func call(ctx context.Context, nc *natsgo.Conn, subject string, req int, res *result) {
	var first []byte
	for attempt := 0; ctx.Err() == nil; attempt++ {
		m := natsgo.NewMsg(subject)
		m.Header.Set("Idempotency-Key", strconv.Itoa(req))
		m.Data = []byte(`{"sku":"A-1","qty":1}`)
		if attempt == 0 && req%7 == 3 { // the reply goes to an inbox nobody listens on
			m.Reply = nc.NewRespInbox()
			_ = nc.PublishMsg(m)
			res.lost.Add(1)
			time.Sleep(requestTimeout)
			continue
		}
		resp, err := nc.RequestMsg(m, requestTimeout)
		if err != nil { // a timeout: the service was slow (or had no responder yet)
			res.timeouts.Add(1)
			continue
		}
		if resp.Header.Get(micro.ErrorCodeHeader) == dnats.CodeRetry { // in progress on the other instance
			res.retries.Add(1)
			ms, _ := strconv.Atoi(resp.Header.Get(dnats.RetryAfterHeader))
			time.Sleep(time.Duration(max(ms, 10)) * time.Millisecond)
			continue
		}
		answer := append([]byte(resp.Header.Get("Order-Id")+" "), resp.Data...)
		if first != nil && !bytes.Equal(answer, first) {
			res.differentAnswer.Add(1)
		}
		if first != nil || attempt == 0 {
			return
		}
		first = answer
	}
}
