package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
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

// `go run ./bench copies` prints issue 26's first figure: "1,000 orders published
// twice, back to back, to two instances with default options drain in at most 3× the
// time of the same orders published once, plus 2 s", with 0 orders run twice and 0
// never run.
//
// Each phase has a JetStream stream, a durable pull consumer and a Redis key prefix
// of its own. Two instances share the consumer, as two processes would: each its own
// NATS connection, go-redis client (redis.NewClient, defaults), dedup.Deduper
// (default options but the run's prefix) with one handler registered with default
// options (ModeDo, the default 30 s lease), and dnats.NewJetStream with default
// options (key strategy, concurrency), Consume()ing through JetStream.Handler with
// the one-second idle heartbeat the adapter's doc asks for. The fn sleeps -work (a
// small amount of work) and counts the order it ran, read from the payload.
//
//   - once: every order published once, with its key in the -key-header header;
//   - copies: every order published twice, back to back (1, 1, 2, 2, ...), both copies
//     with the same key in the -key-header header and no Nats-Msg-Id, so that
//     JetStream's own duplicate window keeps both: two messages the server delivers,
//     one order dedup must run once.
//
// A phase's drain time runs from its first publish until every order has run and the
// consumer has nothing pending and nothing awaiting an ack (its info polled every
// 20 ms). The instances are started before the first publish. The figure passes when
// the copies phase drains within 3 × once + 2 s, no order ran more than once and none
// never ran, in either phase; the command exits non-zero otherwise. A phase that has
// not drained within -timeout ends with what is known, and fails.
//
// Which header the handlers read is the adapter's default key strategy's business:
// this command sets no key strategy. (At the time of writing dnats.DefaultKeyStrategy
// reads Nats-Msg-Id, then the stream sequence: each copy is then a message of its
// own, and every order runs twice.) With -key-header Nats-Msg-Id the server's own
// duplicate window drops the second copies; the publish line says how many it stored.
//
//	go run ./bench copies
//	go run ./bench copies -nats nats://127.0.0.1:4222 -redis 127.0.0.1:6379 -orders 1000

// copiesConfig is what the copies flags say.
type copiesConfig struct {
	natsURL, redisAddr string
	orders             int
	keyHeader          string
	work               time.Duration
	timeout            time.Duration // per phase
}

// The shared consumer's settings: the server's default AckWait, and a MaxDeliver
// (the default, unlimited, is refused by dnats.NewJetStream without
// WithUnlimitedRedelivery) well above what a copy told InProgress needs.
const (
	copiesInstances  = 2
	copiesMaxDeliver = 10
	copiesDurable    = "orders"
	copiesHeartbeat  = time.Second // Consume's idle heartbeat (see JetStream.Handler)
	copiesPoll       = 20 * time.Millisecond
	copiesSlack      = 2 * time.Second // the figure's "plus 2 s"
	copiesFactor     = 3               // and its "3×"
)

func parseCopiesFlags(args []string, stderr io.Writer) (copiesConfig, error) {
	var c copiesConfig
	fs := flag.NewFlagSet("bench copies", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.natsURL, "nats", os.Getenv("DEDUP_NATS_URL"), "NATS URL (default: an in-process server; env DEDUP_NATS_URL)")
	fs.StringVar(&c.redisAddr, "redis", os.Getenv("DEDUP_REDIS_ADDR"), "Redis address (default: an embedded miniredis; env DEDUP_REDIS_ADDR)")
	fs.IntVar(&c.orders, "orders", 1000, "orders; the copies phase publishes each twice")
	fs.StringVar(&c.keyHeader, "key-header", "Idempotency-Key", "the header that carries each order's key (the handlers' key strategy stays the default)")
	fs.DurationVar(&c.work, "work", 2*time.Millisecond, "how long the fn works on each order (a sleep)")
	fs.DurationVar(&c.timeout, "timeout", 2*time.Minute, "give up on a phase that has not drained by then (it fails, with what is known)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	case c.orders < 1 || c.orders > 1_000_000:
		return c, fmt.Errorf("-orders %d is outside 1..1000000", c.orders)
	case !validHeaderName(c.keyHeader):
		return c, fmt.Errorf("-key-header %q is not a header name", c.keyHeader)
	case c.work < 0:
		return c, fmt.Errorf("-work %v is negative", c.work)
	case c.timeout <= 0:
		return c, fmt.Errorf("-timeout %v is not positive", c.timeout)
	}
	return c, nil
}

// validHeaderName reports a non-empty header name of visible ASCII without ':'.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r <= ' ' || r > '~' || r == ':' {
			return false
		}
	}
	return true
}

// errFigureFailed marks a figure that was measured and missed its bound (or ran an
// order twice, or lost one): the command exits non-zero, after its report.
var errFigureFailed = errors.New("figure failed")

// runCopies is `bench copies`.
func runCopies(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseCopiesFlags(args, stderr)
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
	return copies(ctx, cfg, srv, stdout)
}

// copiesPhase is what one phase measured.
type copiesPhase struct {
	name      string
	copies    int // messages published per order
	published int
	stored    int // messages the stream took (the rest were duplicates in its window)
	drain     time.Duration
	drained   bool   // false: timed out (drain is then the time until giving up)
	state     string // the last thing the drain waited for
	runs      []int  // fn runs per order
	outcomes  map[dedup.Outcome]uint64
	actions   map[dnats.Action]uint64
	delivered uint64 // deliveries by the consumer, redeliveries included
}

// ranTwice, neverRan and extraRuns count orders run more than once, orders never run,
// and the runs beyond one per order.
func (p *copiesPhase) ranTwice() (n int) {
	for _, r := range p.runs {
		if r > 1 {
			n++
		}
	}
	return n
}

func (p *copiesPhase) neverRan() (n int) {
	for _, r := range p.runs {
		if r == 0 {
			n++
		}
	}
	return n
}

func (p *copiesPhase) extraRuns() (n int) {
	for _, r := range p.runs {
		n += max(r-1, 0)
	}
	return n
}

// copies runs the once phase, then the copies phase, and prints the figure.
func copies(ctx context.Context, cfg copiesConfig, srv servers, stdout io.Writer) error {
	natsWhere, redisWhere := "given", "given"
	if srv.natsEmbedded {
		natsWhere = "in-process"
	}
	if srv.redisEmbedded {
		redisWhere = "embedded miniredis: its figures mean little"
	}
	fmt.Fprintf(stdout, "copies: nats %s (%s), redis %s (%s)\n", srv.natsURL, natsWhere, srv.redisAddr, redisWhere)
	fmt.Fprintf(stdout, "%d orders, %d instances sharing one durable pull consumer (server's default AckWait, MaxDeliver %d, Consume with a %v idle heartbeat);\n",
		cfg.orders, copiesInstances, copiesMaxDeliver, copiesHeartbeat)
	fmt.Fprintf(stdout, "each instance: dedup.New and Register with default options (lease %v), dnats.NewJetStream with default options (concurrency %d);\n",
		30*time.Second, dnats.DefaultConcurrency)
	fmt.Fprintf(stdout, "fn works %v per order; key in the %s header, no Nats-Msg-Id\n\n", cfg.work, cfg.keyHeader)

	id := runID()
	var phases []*copiesPhase
	for _, n := range []int{1, 2} {
		p, err := copiesRun(ctx, cfg, srv, id, n)
		if p != nil {
			printCopiesPhase(stdout, p)
			phases = append(phases, p)
		}
		if err != nil {
			return err
		}
	}
	return copiesVerdict(stdout, phases[0], phases[1])
}

// printCopiesPhase prints one phase's line and its counts.
func printCopiesPhase(w io.Writer, p *copiesPhase) {
	how := "drained in"
	if !p.drained {
		how = "NOT drained (timed out; waiting for: " + p.state + ") after"
	}
	fmt.Fprintf(w, "%-7s %d published, %d stored; %s %.3f s\n", p.name+":", p.published, p.stored, how, p.drain.Seconds())
	runs := 0
	for _, r := range p.runs {
		runs += r
	}
	fmt.Fprintf(w, "        fn runs %d for %d orders: ran more than once %d (%d extra runs), never ran %d\n",
		runs, len(p.runs), p.ranTwice(), p.extraRuns(), p.neverRan())
	fmt.Fprintf(w, "        deliveries %d; outcomes %s; actions %s\n", p.delivered, fmtOutcomes(p.outcomes), fmtActions(p.actions))
}

// copiesVerdict prints the figure against its bound and returns errFigureFailed when
// it fails.
func copiesVerdict(w io.Writer, once, twice *copiesPhase) error {
	bound := copiesFactor*once.drain + copiesSlack
	fmt.Fprintf(w, "\ncopies/once: %.3f s / %.3f s = %.2f×; bound %d × once + %v = %.3f s\n",
		twice.drain.Seconds(), once.drain.Seconds(), ratio(twice.drain.Seconds(), once.drain.Seconds()),
		copiesFactor, copiesSlack, bound.Seconds())
	var why []string
	if !once.drained || !twice.drained {
		why = append(why, "a phase did not drain")
	}
	if twice.drain > bound {
		why = append(why, fmt.Sprintf("copies drained in %.3f s > %.3f s", twice.drain.Seconds(), bound.Seconds()))
	}
	repeated := once.ranTwice() + twice.ranTwice()
	never := once.neverRan() + twice.neverRan()
	if repeated > 0 {
		why = append(why, fmt.Sprintf("%d orders ran more than once (once %d, copies %d)", repeated, once.ranTwice(), twice.ranTwice()))
	}
	if never > 0 {
		why = append(why, fmt.Sprintf("%d orders never ran (once %d, copies %d)", never, once.neverRan(), twice.neverRan()))
	}
	fmt.Fprintf(w, "repeated (orders run more than once): %d; never ran: %d\n", repeated, never)
	if len(why) == 0 {
		fmt.Fprintln(w, "copies: PASS")
		return nil
	}
	fmt.Fprintln(w, "copies: FAIL: "+strings.Join(why, "; "))
	return fmt.Errorf("copies: %w: %s", errFigureFailed, strings.Join(why, "; "))
}

// copiesInstance is one instance: what one consumer process would hold.
type copiesInstance struct {
	nc      *natsgo.Conn
	rdb     *redis.Client
	dd      *dedup.Deduper
	h       *dedup.Handler
	a       *dnats.JetStream
	cc      jetstream.ConsumeContext
	stopped bool
}

// stop stops consuming, waits for the messages in hand, and closes the rest.
func (in *copiesInstance) stop() {
	if in.stopped {
		return
	}
	in.stopped = true
	if in.cc != nil {
		in.cc.Stop()
		select {
		case <-in.cc.Closed():
		case <-time.After(5 * time.Second):
		}
	}
	if in.a != nil {
		in.a.Wait()
	}
	if in.dd != nil {
		in.dd.Close()
	}
	if in.rdb != nil {
		in.rdb.Close()
	}
	if in.nc != nil {
		in.nc.Close()
	}
}

// copiesRun runs one phase, publishing each order n times, on a stream, consumer and
// prefix of its own, and returns what it measured (nil when set-up failed).
func copiesRun(ctx context.Context, cfg copiesConfig, srv servers, id string, n int) (*copiesPhase, error) {
	p := &copiesPhase{name: "once", copies: n, runs: make([]int, cfg.orders),
		outcomes: map[dedup.Outcome]uint64{}, actions: map[dnats.Action]uint64{}}
	if n > 1 {
		p.name = "copies"
	}
	tag := id + "-" + p.name
	stream, subject, prefix := "DKCOPIES_"+strings.ToUpper(id)+"_"+strings.ToUpper(p.name), "dkcopies."+id+"."+p.name, "dkcopies-"+tag

	nc, err := natsgo.Connect(srv.natsURL, natsgo.Name("dedupkit-bench-copies"))
	if err != nil {
		return nil, fmt.Errorf("connect to nats at %s: %w", srv.natsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(sctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject},
		Storage: jetstream.MemoryStorage, MaxAge: time.Hour}); err != nil {
		return nil, fmt.Errorf("create stream: %w", err)
	}
	defer func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer dcancel()
		if err := js.DeleteStream(dctx, stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			fmt.Fprintln(os.Stderr, "copies: delete stream:", err)
		}
	}()
	if _, err := js.CreateOrUpdateConsumer(sctx, stream, jetstream.ConsumerConfig{Durable: copiesDurable,
		AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: copiesMaxDeliver}); err != nil {
		return nil, fmt.Errorf("create consumer: %w", err)
	}
	// The records go at the end, whatever happened (SCAN and UNLINK under the prefix).
	defer func() {
		rdb := redis.NewClient(&redis.Options{Addr: srv.redisAddr})
		defer rdb.Close()
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		if err := embedded.DeleteKeys(dctx, rdb, prefix); err != nil {
			fmt.Fprintln(os.Stderr, "copies: delete redis keys:", err)
		}
	}()

	runs := make([]atomic.Int32, cfg.orders)
	var ordersRun atomic.Int64 // orders run at least once
	var badPayloads atomic.Int64
	fn := func(ctx context.Context, m *dnats.Msg) error {
		i, err := strconv.Atoi(string(m.Data()))
		if err != nil || i < 0 || i >= cfg.orders {
			badPayloads.Add(1)
			return fmt.Errorf("not an order of the run: %q", m.Data())
		}
		if runs[i].Add(1) == 1 {
			ordersRun.Add(1)
		}
		if cfg.work > 0 {
			select {
			case <-time.After(cfg.work):
			case <-ctx.Done():
			}
		}
		return nil
	}

	pctx, cancelPhase := context.WithTimeout(ctx, cfg.timeout)
	defer cancelPhase()
	instances := make([]*copiesInstance, copiesInstances)
	defer func() {
		for _, in := range instances {
			if in != nil {
				in.stop()
			}
		}
	}()
	for k := range instances {
		in := &copiesInstance{}
		instances[k] = in
		if err := in.start(pctx, srv, stream, prefix, k, fn); err != nil {
			return nil, fmt.Errorf("instance %d: %w", k+1, err)
		}
	}

	start := time.Now()
	p.published, p.stored, err = publishCopies(pctx, js, subject, cfg.keyHeader, "order-"+tag+"-", cfg.orders, n)
	if err == nil {
		p.drained, p.state, err = copiesDrained(pctx, js, stream, &ordersRun, cfg.orders, p.stored)
	}
	p.drain = time.Since(start)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		err = nil // timed out: the report says what is known, and the verdict fails
	}
	for _, in := range instances {
		in.stop()
		s := in.h.Stats()
		for o := dedup.Processed; o <= dedup.CommitUnknown; o++ {
			if c := s.Count(o); c > 0 {
				p.outcomes[o] += c
			}
		}
		as := in.a.Stats()
		for a := dnats.ActNone; a <= dnats.ActTerm; a++ {
			if c := as.Count(a); c > 0 {
				p.actions[a] += c
			}
		}
	}
	for i := range runs {
		p.runs[i] = int(runs[i].Load())
	}
	ictx, icancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer icancel()
	if c, cerr := js.Consumer(ictx, stream, copiesDurable); cerr == nil {
		if info, ierr := c.Info(ictx); ierr == nil {
			p.delivered = info.Delivered.Consumer
		}
	}
	if b := badPayloads.Load(); b > 0 && err == nil {
		err = fmt.Errorf("%d deliveries were not orders of the run", b)
	}
	return p, err
}

// start connects the instance, registers its handler and starts consuming.
func (in *copiesInstance) start(ctx context.Context, srv servers, stream, prefix string, k int, fn dnats.Func) error {
	var err error
	if in.nc, err = natsgo.Connect(srv.natsURL, natsgo.Name(fmt.Sprintf("dedupkit-bench-copies-%d", k+1))); err != nil {
		return fmt.Errorf("connect to nats: %w", err)
	}
	js, err := jetstream.New(in.nc)
	if err != nil {
		return err
	}
	cons, err := js.Consumer(ctx, stream, copiesDurable)
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	in.rdb = redis.NewClient(&redis.Options{Addr: srv.redisAddr})
	st, err := redisstore.New(in.rdb)
	if err != nil {
		return err
	}
	if in.dd, err = dedup.New(st, dedup.WithPrefix(prefix)); err != nil {
		return err
	}
	if in.h, err = in.dd.Register("orders"); err != nil {
		return err
	}
	if in.a, err = dnats.NewJetStream(in.h, cons); err != nil {
		return err
	}
	in.cc, err = cons.Consume(in.a.Handler(ctx, fn), jetstream.PullHeartbeat(copiesHeartbeat))
	if err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	return nil
}

// publishCopies publishes every order n times back to back (order 0 n times, then
// order 1, ...), its key head+i in header, its number as the payload, no Nats-Msg-Id
// (unless header is Nats-Msg-Id), in windows of acks; it returns the messages
// published and those the stream stored.
func publishCopies(ctx context.Context, js jetstream.JetStream, subject, header, head string, orders, n int) (published, stored int, err error) {
	const window = 2000
	futures := make([]jetstream.PubAckFuture, 0, window)
	settle := func() error {
		for _, f := range futures {
			select {
			case ack := <-f.Ok():
				if !ack.Duplicate {
					stored++
				}
			case err := <-f.Err():
				return fmt.Errorf("publish: %w", err)
			case <-ctx.Done():
				return fmt.Errorf("publish: %w", ctx.Err())
			}
		}
		futures = futures[:0]
		return nil
	}
	for i := range orders {
		for range n {
			msg := natsgo.NewMsg(subject)
			msg.Data = []byte(strconv.Itoa(i))
			msg.Header.Set(header, head+strconv.Itoa(i))
			f, err := js.PublishMsgAsync(msg)
			if err != nil {
				return published, stored, fmt.Errorf("publish: %w", err)
			}
			published++
			if futures = append(futures, f); len(futures) == window {
				if err := settle(); err != nil {
					return published, stored, err
				}
			}
		}
	}
	return published, stored, settle()
}

// copiesDrained polls until every order has run and the consumer has delivered every
// stored message and has none pending or awaiting an ack. state says what it last
// waited for.
func copiesDrained(ctx context.Context, js jetstream.JetStream, stream string, ordersRun *atomic.Int64, orders, stored int) (bool, string, error) {
	cons, err := js.Consumer(ctx, stream, copiesDurable)
	if err != nil {
		return false, "consumer", fmt.Errorf("consumer: %w", err)
	}
	state := "no consumer info yet"
	tick := time.NewTicker(copiesPoll)
	defer tick.Stop()
	for {
		if ran := ordersRun.Load(); ran < int64(orders) {
			state = fmt.Sprintf("%d of %d orders run", ran, orders)
		} else if info, err := cons.Info(ctx); err != nil {
			if ctx.Err() != nil {
				return false, state, ctx.Err()
			}
			state = "consumer info: " + err.Error()
		} else if info.NumPending == 0 && info.NumAckPending == 0 && info.Delivered.Stream >= uint64(stored) {
			return true, "", nil
		} else {
			state = fmt.Sprintf("every order run; consumer: %d pending, %d awaiting an ack, delivered up to stream seq %d of %d",
				info.NumPending, info.NumAckPending, info.Delivered.Stream, stored)
		}
		select {
		case <-ctx.Done():
			return false, state, ctx.Err()
		case <-tick.C:
		}
	}
}

// fmtOutcomes renders outcome counts, e.g. "processed=1000 duplicate=1000".
func fmtOutcomes(m map[dedup.Outcome]uint64) string { return fmtCounts(m) }

// fmtActions renders the adapters' action counts, e.g. "ack=2000 nak-with-delay=3".
func fmtActions(m map[dnats.Action]uint64) string { return fmtCounts(m) }

// fmtCounts renders counts by key, in key order, as "key=n ..."; "none" when empty.
func fmtCounts[K interface {
	~uint8
	fmt.Stringer
}](m map[K]uint64) string {
	keys := slices.Sorted(maps.Keys(m))
	if len(keys) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%v=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}
