// Command request-reply shows an idempotent NATS service: a nats.go/micro service
// whose "create order" endpoint is one line, dnats's Replier over a dedup handler
// that stores replies (dedup.WithReplies), and clients that retry.
//
// Two instances of the service (each its own connection and dedup.Deduper, as
// separate processes would be, sharing one Redis) serve the endpoint in micro's
// queue group. Clients send create-order requests, each with an Idempotency-Key,
// and retry until they get an answer: some first attempts time out (the handler is
// slow for them), some lose their reply (the client gave up on that inbox), and a
// retry can land on the instance that is not running the request (a 503 with
// Dedup-Retry-After-Ms: retry later). Every retry of a request gets the first run's
// reply back, byte for byte, headers included; no order is created twice.
//
// The program prints what the clients saw and the service's micro stats, and exits
// non-zero unless every request created exactly one order and every answer to a
// request was the same.
//
// With no flags it starts an in-process NATS server and miniredis. -nats and -redis (or
// DEDUP_NATS_URL and DEDUP_REDIS_ADDR) point it at real servers; it then uses subjects
// and a Redis key prefix of its own and deletes its records at exit.
//
//	go run ./examples/request-reply
//	go run ./examples/request-reply -nats nats://127.0.0.1:4222 -redis 127.0.0.1:6379
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
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
		fmt.Fprintln(os.Stderr, "request-reply:", err)
		os.Exit(1)
	}
}

// Shares of the requests whose first attempt goes wrong.
const (
	slowShare = 0.1  // the handler outlasts the client's timeout
	lostShare = 0.15 // the client gives up on the first reply's inbox before sending
)

// requestTimeout is how long a client waits for an answer before it retries.
const requestTimeout = 150 * time.Millisecond

type config struct {
	natsURL, redisAddr string
	requests           int
	clients            int
	timeout            time.Duration
	verbose            bool
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("request-reply", flag.ContinueOnError)
	fs.StringVar(&c.natsURL, "nats", os.Getenv("DEDUP_NATS_URL"), "NATS URL (default: an in-process server; env DEDUP_NATS_URL)")
	fs.StringVar(&c.redisAddr, "redis", os.Getenv("DEDUP_REDIS_ADDR"), "Redis address (default: an embedded miniredis; env DEDUP_REDIS_ADDR)")
	fs.IntVar(&c.requests, "requests", 200, "create-order requests to send, each with an Idempotency-Key of its own")
	fs.IntVar(&c.clients, "clients", 16, "clients sending requests at once")
	fs.DurationVar(&c.timeout, "timeout", 60*time.Second, "give up if the requests are not all answered by then")
	fs.BoolVar(&c.verbose, "v", false, "log the library's warnings and errors to stderr (keys appear hashed)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	case c.requests < 1 || c.requests > 99999:
		return c, fmt.Errorf("-requests %d is outside 1..99999", c.requests)
	case c.clients < 1 || c.clients > 256:
		return c, fmt.Errorf("-clients %d is outside 1..256", c.clients)
	case c.timeout <= 0:
		return c, fmt.Errorf("-timeout %v is not positive", c.timeout)
	}
	return c, nil
}

// order is what the endpoint creates, and its reply.
type order struct {
	OrderID   string `json:"order_id"`
	Request   string `json:"request"`
	Instance  int    `json:"instance"`
	CreatedAt string `json:"created_at"`
}

// shop is the side effect: orders created, by request, across instances. A request
// that created two orders is the bug dedupkit prevents.
type shop struct {
	mu      sync.Mutex
	created map[string]int
	seq     atomic.Int64
}

func (s *shop) create(req string) string {
	s.mu.Lock()
	s.created[req]++
	s.mu.Unlock()
	return "o-" + strconv.FormatInt(s.seq.Add(1), 10)
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
	subject := "dedupkit.example." + id + ".orders.create"
	prefix := "dedupkit-rr-" + id
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
	fmt.Fprintf(stdout, "subject %s, redis key prefix %s\n\n", subject, prefix)

	sh := &shop{created: make(map[string]int)}
	slow := make(map[string]bool) // requests whose first run outlasts the client's timeout
	for i := range cfg.requests {
		slow[requestID(i)] = mrand.Float64() < slowShare
	}
	var instances []*instance
	defer func() {
		for _, in := range instances {
			in.close()
		}
	}()
	for n := 1; n <= 2; n++ {
		in, err := serve(ctx, n, natsURL, redisAddr, subject, prefix, logger, sh, slow)
		if err != nil {
			return fmt.Errorf("instance %d: %w", n, err)
		}
		instances = append(instances, in)
	}

	nc, err := natsgo.Connect(natsURL, natsgo.Name("dedupkit-example-clients"))
	if err != nil {
		return fmt.Errorf("connect to nats: %w", err)
	}
	defer nc.Close()
	runCtx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	var st clientStats
	answers := make([][]answer, cfg.requests)
	next := atomic.Int64{}
	var wg sync.WaitGroup
	start := time.Now()
	for range cfg.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= cfg.requests || runCtx.Err() != nil {
					return
				}
				answers[i] = call(runCtx, nc, subject, requestID(i), &st)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	for _, in := range instances { // stop the services and wait for their requests
		in.close()
	}

	fmt.Fprintf(stdout, "requests   %6d, by %d clients, in %.2fs\n", cfg.requests, cfg.clients, elapsed.Seconds())
	fmt.Fprintf(stdout, "attempts   %6d: %d timed out (the service was slow), %d replies lost (inbox given up), %d answered 503 (in progress elsewhere) and retried\n\n",
		st.attempts.Load(), st.timeouts.Load(), st.lost.Load(), st.retries.Load())
	fmt.Fprintf(stdout, "%-10s %10s %8s %10s %10s %9s\n", "instance", "requests", "errors", "ran fn", "replayed", "retry-503")
	for _, in := range instances {
		ms := in.stats
		rs := in.replier.Stats()
		fmt.Fprintf(stdout, "%-10d %10d %8d %10d %10d %9d\n", in.n, ms.NumRequests, ms.NumErrors,
			rs.Count(dnats.ReplyRun), rs.Count(dnats.ReplyStored), rs.Count(dnats.ReplyRetry))
	}
	fmt.Fprintln(stdout)
	if err := runCtx.Err(); err != nil {
		return fmt.Errorf("not every request answered: %w", err)
	}

	// Every request created one order, and every answer it got was the same reply.
	var twice, never, differ int
	for i := range cfg.requests {
		req := requestID(i)
		switch n := sh.created[req]; {
		case n == 0:
			never++
		case n > 1:
			twice++
		}
		for _, a := range answers[i][1:] {
			if !bytes.Equal(a.data, answers[i][0].data) || a.orderID != answers[i][0].orderID {
				differ++
				break
			}
		}
	}
	if never > 0 || twice > 0 || differ > 0 {
		return fmt.Errorf("%d requests created no order, %d more than one, %d got different answers", never, twice, differ)
	}
	fmt.Fprintf(stdout, "ok: each of %d requests created exactly one order; its %d retries got the first reply back\n",
		cfg.requests, st.replayed.Load())
	return nil
}

func requestID(i int) string { return fmt.Sprintf("req-%05d", i) }

// instance is one process of the service: its connection, Deduper and micro service.
type instance struct {
	n       int
	nc      *natsgo.Conn
	rdb     *redis.Client
	d       *dedup.Deduper
	replier *dnats.Replier
	svc     micro.Service
	stats   micro.EndpointStats // at close
	done    bool
}

func serve(ctx context.Context, n int, natsURL, redisAddr, subject, prefix string, logger *slog.Logger, sh *shop, slow map[string]bool) (*instance, error) {
	in := &instance{n: n}
	in.rdb = redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	store, err := dedup.NewRedisStore(in.rdb)
	if err != nil {
		in.rdb.Close()
		return nil, err
	}
	if in.d, err = dedup.New(store, dedup.WithPrefix(prefix), dedup.WithLogger(logger)); err != nil {
		in.rdb.Close()
		return nil, err
	}
	// replies up to 64 KiB, kept as long as the orders' idempotency window
	create, err := in.d.Register("create-order", dedup.WithReplies(0), dedup.WithRetention(time.Hour))
	if err == nil {
		in.replier, err = dnats.NewReplier(create, dnats.WithLogger(logger))
	}
	if err == nil {
		in.nc, err = natsgo.Connect(natsURL, natsgo.Name(fmt.Sprintf("dedupkit-example-orders-%d", n)))
	}
	if err == nil {
		in.svc, err = micro.AddService(in.nc, micro.Config{Name: "orders", Version: "1.0.0"})
	}
	if err != nil {
		in.close()
		return nil, err
	}
	createOrder := func(ctx context.Context, m *dnats.Msg) (dnats.Reply, error) {
		req := m.Header("Idempotency-Key")
		var body struct {
			SKU string `json:"sku"`
		}
		if err := json.Unmarshal(m.Data(), &body); err != nil || body.SKU == "" {
			return dnats.Reply{}, &dnats.ServiceError{Code: "400", Description: "want {\"sku\": ...}"}
		}
		if slow[req] {
			select { // longer than the client waits: it times out and retries
			case <-time.After(2 * requestTimeout):
			case <-ctx.Done():
				return dnats.Reply{}, ctx.Err()
			}
		}
		o := order{OrderID: sh.create(req), Request: req, Instance: n, CreatedAt: time.Now().UTC().Format(time.RFC3339Nano)}
		data, err := json.Marshal(o)
		if err != nil {
			return dnats.Reply{}, err
		}
		return dnats.Reply{Header: natsgo.Header{"Order-Id": {o.OrderID}}, Data: data}, nil
	}
	// The idempotent endpoint: one line.
	if err := in.svc.AddEndpoint("create", in.replier.MicroHandler(ctx, createOrder), micro.WithEndpointSubject(subject)); err != nil {
		in.close()
		return nil, err
	}
	if err := in.nc.Flush(); err != nil {
		in.close()
		return nil, err
	}
	return in, nil
}

// close stops the service and waits for its requests in hand, then closes the
// Deduper, the connection and the Redis client. Idempotent; not safe for concurrent
// use.
func (in *instance) close() {
	if in.done {
		return
	}
	in.done = true
	if in.svc != nil {
		if s := in.svc.Stats(); len(s.Endpoints) > 0 {
			in.stats = *s.Endpoints[0]
		}
		_ = in.svc.Stop()
	}
	if in.replier != nil {
		in.replier.Wait()
	}
	if in.d != nil {
		in.d.Close()
	}
	if in.nc != nil {
		in.nc.Close()
	}
	in.rdb.Close()
}

// clientStats is what the clients saw.
type clientStats struct {
	attempts, timeouts, lost, retries, replayed atomic.Int64
}

// answer is one reply a client got for a request.
type answer struct {
	orderID string
	data    []byte
}

// call sends one request until it is answered, as a client that retries does: after
// a timeout, after giving up on a reply, and after a 503 (waiting what it says). It
// returns every reply it got (after the first, only retries of purposely lost or
// slow ones get one: each must be the first's).
func call(ctx context.Context, nc *natsgo.Conn, subject, req string, st *clientStats) []answer {
	var got []answer
	lose := mrand.Float64() < lostShare
	for attempt := 0; ctx.Err() == nil; attempt++ {
		m := natsgo.NewMsg(subject)
		m.Header.Set("Idempotency-Key", req)
		m.Data = []byte(`{"sku":"A-1","qty":1}`)
		st.attempts.Add(1)
		if lose && attempt == 0 {
			// the client's first reply is lost: sent to an inbox nobody listens on
			m.Reply = nc.NewRespInbox()
			if err := nc.PublishMsg(m); err == nil {
				st.lost.Add(1)
				time.Sleep(requestTimeout)
			}
			continue
		}
		resp, err := nc.RequestMsg(m, requestTimeout)
		switch {
		case errors.Is(err, natsgo.ErrTimeout):
			st.timeouts.Add(1)
			continue
		case err != nil:
			time.Sleep(requestTimeout)
			continue
		}
		if code := resp.Header.Get(micro.ErrorCodeHeader); code != "" {
			if code == dnats.CodeRetry {
				st.retries.Add(1)
				ms, _ := strconv.Atoi(resp.Header.Get(dnats.RetryAfterHeader))
				time.Sleep(time.Duration(max(ms, 10)) * time.Millisecond)
				continue
			}
			return append(got, answer{orderID: "error " + code})
		}
		got = append(got, answer{orderID: resp.Header.Get("Order-Id"), data: resp.Data})
		if attempt > 0 {
			st.replayed.Add(1)
		}
		if len(got) == 2 || attempt == 0 {
			return got
		}
		// a retried request: ask once more, to see the same reply again
	}
	return got
}

// startNATS returns url's server, or an in-process one storing in a temp dir.
func startNATS(url string, stdout io.Writer) (string, func(), error) {
	if url != "" {
		fmt.Fprintln(stdout, "nats:", url)
		return url, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "dedupkit-request-reply-")
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
		fmt.Fprintln(os.Stderr, "request-reply: delete redis records:", err)
	}
}
