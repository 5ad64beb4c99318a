// Command jetstream is dedupkit's main job end to end: two handlers with different
// retention ("inventory" 72h, "email" 1h), each on its own durable pull consumer of one
// JetStream stream, run by several consumer instances that share one Redis. Each
// instance has its own dedup.Deduper and NATS connection, as separate processes would;
// most consume with Consume (JetStream.Handler), and one instance per handler pulls
// Fetch batches (JetStream.HandleBatch), so both paths run.
//
// The orders are published with a Nats-Msg-Id, and duplicates are injected the three
// ways JetStream produces them despite its own duplicate window:
//
//   - republished ids: a share of the orders is published again after the stream's
//     (short) duplicate window has passed, so the server stores them a second time;
//     a few are also republished at once, which the server itself rejects;
//   - forced redeliveries: some handler runs fail (NakWithDelay) or panic (Nak) on
//     their first run, and the message comes back;
//   - lost acks: for some deliveries the Ack never reaches the server, so it
//     redelivers the message after AckWait, although it was processed.
//
// Side effects are counted per (handler, order). The program waits until every order
// has been processed by both handlers and both consumers are drained, prints what
// happened, and exits non-zero unless every order ran exactly once per handler and
// nothing was terminated.
//
// With no flags it starts an in-process NATS server (JetStream in a temp dir) and
// miniredis. -nats and -redis (or DEDUP_NATS_URL and DEDUP_REDIS_ADDR) point it at real
// servers; it then uses a stream, subjects and Redis key prefix of its own and deletes
// them at exit.
//
// -redis-cluster runs it on a Redis Cluster: alone, the program spawns a 3-master
// cluster of redis-server processes (redis-server must be on PATH) and stops it at
// exit; -redis-cluster=host:port,host:port names seed nodes of an existing cluster
// (the "=" is needed). Each instance then uses a redis.ClusterClient.
//
//	go run ./examples/jetstream
//	go run ./examples/jetstream -nats nats://127.0.0.1:4222 -redis 127.0.0.1:6379
//	go run ./examples/jetstream -redis-cluster
//	go run ./examples/jetstream -redis-cluster=127.0.0.1:7000,127.0.0.1:7001
package main

import (
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
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
		fmt.Fprintln(os.Stderr, "jetstream:", err)
		os.Exit(1)
	}
}

// The stream and consumers. The duplicate window is short so that republishing past
// it takes a moment; AckWait is short so that a lost ack is redelivered quickly.
const (
	dupWindow     = 200 * time.Millisecond
	ackWait       = time.Second
	maxDeliver    = 10
	consumeBuffer = 50          // messages Consume keeps buffered per instance
	pullHeartbeat = time.Second // Consume's idle heartbeat
	fetchBatch    = 100         // messages per Fetch
	fetchWait     = 250 * time.Millisecond
	leaseTime     = 5 * time.Second // each handler's dedup lease
)

// What is injected, as shares of the orders (per handler for failures, panics and
// lost acks).
const (
	republishShare = 0.10 // published again after the duplicate window
	withinShare    = 0.05 // published again at once: the server drops these
	failShare      = 0.03 // the handler fails on its first run: NakWithDelay
	panicShare     = 0.01 // the handler panics on its first run: Nak
	dropAckShare   = 0.04 // the first Ack of the order is lost: redelivery after AckWait
)

// handlerSpecs are the two handlers, each with its own retention and consumer.
var handlerSpecs = []struct {
	name      string
	retention time.Duration
}{
	{"inventory", 72 * time.Hour},
	{"email", time.Hour},
}

type config struct {
	natsURL, redisAddr string
	cluster            clusterFlag
	orders, instances  int
	timeout            time.Duration
	verbose            bool
}

// clusterFlag is -redis-cluster: a flag that may stand alone (spawn a cluster) or
// carry comma-separated seed addresses (-redis-cluster=a,b).
type clusterFlag struct {
	on    bool
	seeds []string
}

func (f *clusterFlag) String() string {
	if f == nil || !f.on {
		return ""
	}
	return strings.Join(f.seeds, ",")
}

func (f *clusterFlag) Set(v string) error {
	switch v {
	case "true":
		f.on, f.seeds = true, nil
	case "false":
		f.on, f.seeds = false, nil
	default:
		f.on, f.seeds = true, nil
		for a := range strings.SplitSeq(v, ",") {
			if a = strings.TrimSpace(a); a != "" {
				f.seeds = append(f.seeds, a)
			}
		}
		if len(f.seeds) == 0 {
			return fmt.Errorf("no seed address in %q", v)
		}
	}
	return nil
}

// IsBoolFlag lets -redis-cluster stand alone.
func (f *clusterFlag) IsBoolFlag() bool { return true }

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("jetstream", flag.ContinueOnError)
	fs.StringVar(&c.natsURL, "nats", os.Getenv("DEDUP_NATS_URL"), "NATS URL (default: an in-process server; env DEDUP_NATS_URL)")
	fs.StringVar(&c.redisAddr, "redis", os.Getenv("DEDUP_REDIS_ADDR"), "Redis address (default: an embedded miniredis; env DEDUP_REDIS_ADDR)")
	fs.Var(&c.cluster, "redis-cluster", "use a Redis Cluster: alone, spawn a 3-master one (redis-server on PATH); =host:port,... for seed nodes of an existing one")
	fs.IntVar(&c.orders, "orders", 3000, "distinct orders to publish")
	fs.IntVar(&c.instances, "instances", 3, "consumer instances per handler (each its own Deduper and connection)")
	fs.DurationVar(&c.timeout, "timeout", 25*time.Second, "give up if the consumers have not drained by then")
	fs.BoolVar(&c.verbose, "v", false, "log the library's warnings and errors to stderr (keys appear hashed)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	redisSet := false
	fs.Visit(func(f *flag.Flag) { redisSet = redisSet || f.Name == "redis" })
	switch {
	case c.cluster.on && redisSet && c.redisAddr != "":
		return c, errors.New("-redis and -redis-cluster both given: name the cluster's seeds with -redis-cluster=host:port,...")
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	case c.orders < 1 || c.orders > 99999:
		return c, fmt.Errorf("-orders %d is outside 1..99999", c.orders)
	case c.instances < 1 || c.instances > 32:
		return c, fmt.Errorf("-instances %d is outside 1..32", c.instances)
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

	// Names of our own: a shared server keeps other runs' streams and records apart.
	id, err := runID()
	if err != nil {
		return err
	}
	names := runNames{
		stream:  "DEDUPKIT_EX_" + strings.ToUpper(id),
		subject: "dedupkit.example." + id + ".orders",
		prefix:  "dedupkit-ex-" + id,
	}
	fmt.Fprintln(stdout, "run", id)

	natsURL, stopNATS, err := startNATS(cfg.natsURL, stdout)
	if err != nil {
		return err
	}
	defer stopNATS()
	rt, stopRedis, err := startRedis(cfg, stdout)
	if err != nil {
		return err
	}
	defer stopRedis()

	// The control connection creates the stream and consumers, publishes, and watches.
	nc, err := natsgo.Connect(natsURL, natsgo.Name("dedupkit-example-control"))
	if err != nil {
		return fmt.Errorf("connect to nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	setupCtx, cancelSetup := context.WithTimeout(ctx, 10*time.Second)
	defer cancelSetup()
	if _, err := js.CreateStream(setupCtx, jetstream.StreamConfig{
		Name:       names.stream,
		Subjects:   []string{names.subject},
		Storage:    jetstream.MemoryStorage,
		Duplicates: dupWindow,
		MaxAge:     time.Hour, // a safety net should the deletion at exit not happen
	}); err != nil {
		return fmt.Errorf("create stream: %w", err)
	}
	defer deleteStream(js, names.stream)
	fmt.Fprintf(stdout, "stream %s on %s, duplicate window %v, AckWait %v, MaxDeliver %d\n",
		names.stream, names.subject, dupWindow, ackWait, maxDeliver)
	for _, spec := range handlerSpecs {
		if _, err := js.CreateOrUpdateConsumer(setupCtx, names.stream, jetstream.ConsumerConfig{
			Durable:       spec.name,
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       ackWait,
			MaxDeliver:    maxDeliver,
			MaxAckPending: 4 * fetchBatch * cfg.instances,
		}); err != nil {
			return fmt.Errorf("create consumer %s: %w", spec.name, err)
		}
	}
	// Redis records are deleted at exit by prefix (SCAN and UNLINK, never FLUSHDB).
	defer deletePrefix(rt, names.prefix)

	tallies := make([]*tally, len(handlerSpecs))
	for h, spec := range handlerSpecs {
		tallies[h] = newTally(spec.name, cfg.orders)
	}

	// Start the instances, then publish while they consume.
	runCtx, stopConsumers := context.WithCancel(ctx)
	fleet := &fleet{logger: logger, stop: stopConsumers}
	defer fleet.close()
	for i := range cfg.instances {
		if err := fleet.start(runCtx, i, cfg.instances, natsURL, rt, names, tallies); err != nil {
			return fmt.Errorf("instance %d: %w", i+1, err)
		}
	}
	fmt.Fprintf(stdout, "instances %d per handler; %s\n", cfg.instances, fleet.describe())
	fmt.Fprintf(stdout, "redis key prefix %s\n\n", names.prefix)

	start := time.Now()
	waitCtx, cancelWait := context.WithTimeout(ctx, cfg.timeout)
	defer cancelWait()
	pub, err := publish(waitCtx, js, names.subject, cfg.orders)
	if err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	drainErr := waitDrained(waitCtx, js, names.stream, tallies)
	elapsed := time.Since(start)

	// Stop consuming, then close the Dedupers and connections, before the summary.
	fleet.close()

	printSummary(stdout, pub, tallies, elapsed)
	if drainErr != nil {
		return drainErr
	}
	return verify(stdout, tallies)
}

type runNames struct{ stream, subject, prefix string }

func runID() (string, error) {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// startNATS returns url's server, or an in-process one storing in a temp dir.
func startNATS(url string, stdout io.Writer) (string, func(), error) {
	if url != "" {
		fmt.Fprintln(stdout, "nats:", url)
		return url, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "dedupkit-jetstream-")
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

// redisTarget is the Redis the instances share: one server, or a cluster's seeds.
type redisTarget struct {
	addrs   []string
	cluster bool
}

// client returns a new client of the target: each instance has its own, as separate
// processes would.
func (r redisTarget) client() redis.UniversalClient {
	if r.cluster {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: r.addrs})
	}
	return redis.NewClient(&redis.Options{Addr: r.addrs[0], ContextTimeoutEnabled: true})
}

// startRedis returns the configured Redis: a cluster (seeds, or a spawned one),
// cfg.redisAddr, or an embedded miniredis.
func startRedis(cfg config, stdout io.Writer) (redisTarget, func(), error) {
	switch {
	case cfg.cluster.on && len(cfg.cluster.seeds) > 0:
		fmt.Fprintln(stdout, "redis: cluster, seeds", strings.Join(cfg.cluster.seeds, ","))
		return redisTarget{addrs: cfg.cluster.seeds, cluster: true}, func() {}, nil
	case cfg.cluster.on:
		addrs, stop, err := embedded.StartRedisCluster("", 3)
		if err != nil {
			return redisTarget{}, nil, fmt.Errorf("spawn a redis cluster: %w", err)
		}
		fmt.Fprintln(stdout, "redis: spawned 3-master cluster at", strings.Join(addrs, ","))
		return redisTarget{addrs: addrs, cluster: true}, stop, nil
	case cfg.redisAddr != "":
		fmt.Fprintln(stdout, "redis:", cfg.redisAddr)
		return redisTarget{addrs: []string{cfg.redisAddr}}, func() {}, nil
	}
	srv, err := embedded.StartRedis()
	if err != nil {
		return redisTarget{}, nil, err
	}
	fmt.Fprintln(stdout, "redis: embedded miniredis at", srv.Addr())
	return redisTarget{addrs: []string{srv.Addr()}}, srv.Close, nil
}

func deleteStream(js jetstream.JetStream, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		fmt.Fprintln(os.Stderr, "jetstream: delete stream:", err)
	}
}

// deletePrefix removes this run's records: SCAN and UNLINK, never FLUSHDB on a
// shared Redis. On a cluster it scans every master.
func deletePrefix(rt redisTarget, prefix string) {
	rdb := rt.client()
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := embedded.DeleteKeys(ctx, rdb, prefix); err != nil {
		fmt.Fprintln(os.Stderr, "jetstream: delete redis records:", err)
	}
}

// order is the message payload.
type order struct {
	ID  string `json:"id"`
	Seq int    `json:"seq"`
	SKU string `json:"sku"`
	Qty int    `json:"qty"`
}

func orderID(seq int) string { return fmt.Sprintf("order-%05d", seq) }

// orderSeq reads the order number back from a Nats-Msg-Id; -1 if it is not one of ours.
func orderSeq(id string, orders int) int {
	n, err := strconv.Atoi(strings.TrimPrefix(id, "order-"))
	if err != nil || !strings.HasPrefix(id, "order-") || n < 0 || n >= orders {
		return -1
	}
	return n
}

// published is what publish did.
type published struct {
	orders, stored               int
	within, withinStored         int // republished inside the duplicate window
	republished, republishStored int // republished after it
}

// publish sends every order once (and a few at once again, inside the duplicate
// window), waits for the window to pass, and republishes a share of the orders.
func publish(ctx context.Context, js jetstream.JetStream, subject string, orders int) (published, error) {
	p := published{orders: orders}
	within := pick(orders, withinShare)
	var first, again []jetstream.PubAckFuture
	for seq := range orders {
		f, err := publishOrder(js, subject, seq)
		if err != nil {
			return p, err
		}
		first = append(first, f)
		if within[seq] {
			if f, err = publishOrder(js, subject, seq); err != nil {
				return p, err
			}
			again = append(again, f)
		}
	}
	var err error
	if p.stored, err = settle(ctx, first); err != nil {
		return p, err
	}
	p.within = len(again)
	if p.withinStored, err = settle(ctx, again); err != nil {
		return p, err
	}

	// Wait until the server has forgotten the ids, then publish some of them again.
	select {
	case <-time.After(2*dupWindow + 100*time.Millisecond):
	case <-ctx.Done():
		return p, ctx.Err()
	}
	var late []jetstream.PubAckFuture
	for seq, ok := range pick(orders, republishShare) {
		if !ok {
			continue
		}
		f, err := publishOrder(js, subject, seq)
		if err != nil {
			return p, err
		}
		late = append(late, f)
	}
	p.republished = len(late)
	p.republishStored, err = settle(ctx, late)
	return p, err
}

func publishOrder(js jetstream.JetStream, subject string, seq int) (jetstream.PubAckFuture, error) {
	data, err := json.Marshal(order{ID: orderID(seq), Seq: seq, SKU: fmt.Sprintf("sku-%03d", seq%97), Qty: 1 + seq%5})
	if err != nil {
		return nil, err
	}
	msg := natsgo.NewMsg(subject)
	msg.Data = data
	msg.Header.Set(jetstream.MsgIDHeader, orderID(seq))
	return js.PublishMsgAsync(msg)
}

// settle waits for the publish acks and returns how many messages the stream stored
// (the rest it recognised as duplicates inside its window).
func settle(ctx context.Context, futures []jetstream.PubAckFuture) (int, error) {
	stored := 0
	for _, f := range futures {
		select {
		case ack := <-f.Ok():
			if !ack.Duplicate {
				stored++
			}
		case err := <-f.Err():
			return stored, err
		case <-ctx.Done():
			return stored, ctx.Err()
		}
	}
	return stored, nil
}

// pick marks ceil(share × n) of n orders at random.
func pick(n int, share float64) []bool {
	k := int(share*float64(n) + 0.999)
	marked := make([]bool, n)
	for _, i := range mrand.Perm(n)[:min(k, n)] {
		marked[i] = true
	}
	return marked
}

// tally is what happened to one handler, across instances.
type tally struct {
	name    string
	orders  int
	effects []atomic.Int32 // side effects per order: must end at exactly 1

	failOnce, panicOnce, dropAck []atomic.Bool // armed injections per order
	failures, panics, dropped    atomic.Int64  // injections that fired

	runs, deliveries, redeliveries atomic.Int64

	mu       sync.Mutex
	handlers []*dedup.Handler
	adapters []*dnats.JetStream
}

func newTally(name string, orders int) *tally {
	t := &tally{
		name: name, orders: orders,
		effects:   make([]atomic.Int32, orders),
		failOnce:  make([]atomic.Bool, orders),
		panicOnce: make([]atomic.Bool, orders),
		dropAck:   make([]atomic.Bool, orders),
	}
	perm := mrand.Perm(orders)
	nFail := int(failShare*float64(orders) + 0.999)
	nPanic := int(panicShare*float64(orders) + 0.999)
	for j, i := range perm {
		switch {
		case j < nFail:
			t.failOnce[i].Store(true)
		case j < nFail+nPanic:
			t.panicOnce[i].Store(true)
		}
	}
	for i, ok := range pick(orders, dropAckShare) {
		t.dropAck[i].Store(ok)
	}
	return t
}

var errInjected = errors.New("injected failure")

// work is the handler's side effect: it reserves stock or sends the email, counted in
// memory. Some orders fail or panic on their first run.
func (t *tally) work(_ context.Context, m *dnats.Msg) error {
	var o order
	if err := json.Unmarshal(m.Data(), &o); err != nil {
		return fmt.Errorf("decode order: %w", err)
	}
	if o.Seq < 0 || o.Seq >= t.orders {
		return fmt.Errorf("order number %d out of range", o.Seq)
	}
	t.runs.Add(1)
	if t.failOnce[o.Seq].CompareAndSwap(true, false) {
		t.failures.Add(1)
		return errInjected
	}
	if t.panicOnce[o.Seq].CompareAndSwap(true, false) {
		t.panics.Add(1)
		panic("injected panic")
	}
	t.effects[o.Seq].Add(1)
	return nil
}

// deliver counts a delivery and wraps it so that its Ack may be lost.
func (t *tally) deliver(msg jetstream.Msg) jetstream.Msg {
	t.deliveries.Add(1)
	if md, err := msg.Metadata(); err == nil && md.NumDelivered > 1 {
		t.redeliveries.Add(1)
	}
	w := lossyAck{Msg: msg, dropped: &t.dropped}
	if seq := orderSeq(msg.Headers().Get(jetstream.MsgIDHeader), t.orders); seq >= 0 {
		w.drop = &t.dropAck[seq]
	}
	return w
}

// completed returns how many orders have had their side effect at least once.
func (t *tally) completed() int {
	n := 0
	for i := range t.effects {
		if t.effects[i].Load() > 0 {
			n++
		}
	}
	return n
}

// lossyAck is a delivery whose Ack is, once for some orders, silently not sent: as
// when the ack is lost on the way or the consumer dies right after processing. The
// server redelivers the message after AckWait, and dedup answers Duplicate.
type lossyAck struct {
	jetstream.Msg
	drop    *atomic.Bool
	dropped *atomic.Int64
}

func (m lossyAck) lose() bool {
	if m.drop != nil && m.drop.CompareAndSwap(true, false) {
		m.dropped.Add(1)
		return true
	}
	return false
}

func (m lossyAck) Ack() error {
	if m.lose() {
		return nil
	}
	return m.Msg.Ack()
}

func (m lossyAck) DoubleAck(ctx context.Context) error {
	if m.lose() {
		return nil
	}
	return m.Msg.DoubleAck(ctx)
}

// lossyBatch hands HandleBatch the deliveries of a Fetch batch, each wrapped.
type lossyBatch struct {
	jetstream.MessageBatch
	t *tally
}

func (b lossyBatch) Messages() <-chan jetstream.Msg {
	out := make(chan jetstream.Msg, fetchBatch)
	for msg := range b.MessageBatch.Messages() {
		out <- b.t.deliver(msg)
	}
	close(out)
	return out
}

// fleet is the consumer instances: what each would be as its own process.
type fleet struct {
	logger   *slog.Logger
	stop     context.CancelFunc // cancels the consumers' context
	mu       sync.Mutex
	consumes []jetstream.ConsumeContext
	handlers []*dnats.JetStream // adapters whose Handler feeds a Consume
	fetchers sync.WaitGroup
	closers  []func() // in reverse order: Dedupers, then connections
	modes    []string
	closed   bool
}

// fetches says whether instance i runs handler h with Fetch batches (else Consume):
// instance 1 for the first handler, instance 2 for the second.
func fetches(i, h, instances int) bool { return i == h%instances }

func (f *fleet) start(ctx context.Context, i, instances int, natsURL string, rt redisTarget, names runNames, tallies []*tally) error {
	nc, err := natsgo.Connect(natsURL, natsgo.Name(fmt.Sprintf("dedupkit-example-%d", i+1)))
	if err != nil {
		return fmt.Errorf("connect to nats: %w", err)
	}
	f.closers = append(f.closers, nc.Close)
	rdb := rt.client()
	f.closers = append(f.closers, func() { rdb.Close() })
	store, err := dedup.NewRedisStore(rdb)
	if err != nil {
		return err
	}
	d, err := dedup.New(store, dedup.WithPrefix(names.prefix), dedup.WithLogger(f.logger))
	if err != nil {
		return err
	}
	f.closers = append(f.closers, func() { d.Close() })
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	for h, spec := range handlerSpecs {
		t := tallies[h]
		// The lease bounds how long a stalled instance can hold an order before another
		// may run it; a rival told InProgress retries after what is left of it. The
		// example never crashes an instance, so the lease only has to outlast a stall:
		// 5s kept each order to one run with four race-built copies on two cores, where
		// 2s did not; longer would hold up draining behind the rare InProgress answer.
		dh, err := d.Register(spec.name, dedup.WithRetention(spec.retention), dedup.WithLease(leaseTime))
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		cons, err := js.Consumer(cctx, names.stream, spec.name)
		cancel()
		if err != nil {
			return fmt.Errorf("consumer %s: %w", spec.name, err)
		}
		a, err := dnats.NewJetStream(dh, cons,
			dnats.WithBackoff(func(n uint64) time.Duration { return time.Duration(n) * 100 * time.Millisecond }),
			dnats.WithLogger(f.logger))
		if err != nil {
			return err
		}
		t.mu.Lock()
		t.handlers = append(t.handlers, dh)
		t.adapters = append(t.adapters, a)
		t.mu.Unlock()

		if fetches(i, h, instances) {
			f.modes = append(f.modes, fmt.Sprintf("%s: Fetch on instance %d", spec.name, i+1))
			f.fetchers.Add(1)
			go f.fetchLoop(ctx, cons, a, t)
			continue
		}
		handle := a.Handler(ctx, t.work)
		cc, err := cons.Consume(func(msg jetstream.Msg) { handle(t.deliver(msg)) },
			jetstream.PullMaxMessages(consumeBuffer),
			jetstream.PullHeartbeat(pullHeartbeat), // bounds nats.go's Consume stall (nats-io/nats.go#1622)
			jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
				f.logger.Warn("consume", "handler", spec.name, "instance", i+1, "err", err)
			}))
		if err != nil {
			return fmt.Errorf("consume %s: %w", spec.name, err)
		}
		f.mu.Lock()
		f.consumes = append(f.consumes, cc)
		f.handlers = append(f.handlers, a)
		f.mu.Unlock()
	}
	return nil
}

// fetchLoop pulls batches and runs each with one store round trip for the checks (each
// order's completion goes out as its fn returns), until ctx is cancelled.
func (f *fleet) fetchLoop(ctx context.Context, cons jetstream.Consumer, a *dnats.JetStream, t *tally) {
	defer f.fetchers.Done()
	for ctx.Err() == nil {
		batch, err := cons.Fetch(fetchBatch, jetstream.FetchMaxWait(fetchWait))
		if err == nil {
			_, err = a.HandleBatch(ctx, lossyBatch{batch, t}, t.work)
		}
		if err != nil && ctx.Err() == nil {
			f.logger.Warn("fetch", "handler", t.name, "err", err)
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
			}
		}
	}
}

func (f *fleet) describe() string {
	s := "Consume on the other instances"
	if len(f.modes) > 0 {
		s = strings.Join(f.modes, ", ") + "; " + s
	}
	return s
}

// close stops consuming, waits for the messages in hand and the fetch loops, then
// closes the Dedupers and connections. Idempotent.
func (f *fleet) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	f.closed = true
	f.stop()
	for _, cc := range f.consumes {
		cc.Stop()
	}
	for _, cc := range f.consumes {
		<-cc.Closed()
	}
	for _, a := range f.handlers {
		a.Wait() // Handler runs messages on goroutines of its own
	}
	f.fetchers.Wait()
	for i := len(f.closers) - 1; i >= 0; i-- {
		f.closers[i]()
	}
}

// waitDrained waits until every order has been processed by every handler and the
// consumers have nothing pending and nothing awaiting an ack.
func waitDrained(ctx context.Context, js jetstream.JetStream, stream string, tallies []*tally) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	last := "no consumer info yet"
	for {
		drained, state, err := checkDrained(ctx, js, stream, tallies)
		switch {
		case err == nil && drained:
			return nil
		case err == nil:
			last = state
		case ctx.Err() == nil:
			last = "consumer info: " + err.Error()
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("not drained (%s): %w", last, ctx.Err())
		}
	}
}

func checkDrained(ctx context.Context, js jetstream.JetStream, stream string, tallies []*tally) (bool, string, error) {
	drained := true
	var state []string
	for _, t := range tallies {
		c, err := js.Consumer(ctx, stream, t.name)
		if err != nil {
			return false, "", err
		}
		info, err := c.Info(ctx)
		if err != nil {
			return false, "", err
		}
		done := t.completed()
		if done < t.orders || info.NumPending > 0 || info.NumAckPending > 0 {
			drained = false
		}
		state = append(state, fmt.Sprintf("%s %d/%d orders done, %d pending, %d awaiting ack",
			t.name, done, t.orders, info.NumPending, info.NumAckPending))
	}
	return drained, strings.Join(state, "; "), nil
}

func printSummary(w io.Writer, p published, tallies []*tally, elapsed time.Duration) {
	fmt.Fprintf(w, "published    %6d orders, %d stored\n", p.orders, p.stored)
	fmt.Fprintf(w, "republished  %6d inside the duplicate window, %d stored (the server dropped the rest)\n", p.within, p.withinStored)
	fmt.Fprintf(w, "republished  %6d after the duplicate window, %d stored\n", p.republished, p.republishStored)
	fmt.Fprintf(w, "drained in   %6.2fs\n\n", elapsed.Seconds())

	fmt.Fprintf(w, "%-10s %10s %11s %6s %9s %6s %8s %10s %10s %11s\n",
		"handler", "deliveries", "redelivered", "runs", "processed", "failed", "panicked", "dup-local", "dup-redis", "in-progress")
	for _, t := range tallies {
		st := t.dedupStats()
		fmt.Fprintf(w, "%-10s %10d %11d %6d %9d %6d %8d %10d %10d %11d\n",
			t.name, t.deliveries.Load(), t.redeliveries.Load(), t.runs.Load(), st.Count(dedup.Processed),
			st.Count(dedup.Failed), st.Count(dedup.Panicked), st.LocalDuplicates, st.StoreDuplicates, st.Count(dedup.InProgress))
	}
	fmt.Fprintf(w, "\n%-10s %10s %15s %6s %6s %6s %13s %11s\n",
		"acks", "ack", "nak-with-delay", "nak", "term", "none", "acks-lost", "ack-errors")
	for _, t := range tallies {
		st := t.ackStats()
		fmt.Fprintf(w, "%-10s %10d %15d %6d %6d %6d %13d %11d\n",
			t.name, st.Count(dnats.ActAck)+st.Count(dnats.ActDoubleAck), st.Count(dnats.ActNakWithDelay),
			st.Count(dnats.ActNak), st.Count(dnats.ActTerm), st.Count(dnats.ActNone), t.dropped.Load(), st.AckErrors)
	}
	fmt.Fprintln(w)
}

// dedupStats sums the handler's dedup counters over the instances.
func (t *tally) dedupStats() sumStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	var s sumStats
	for _, h := range t.handlers {
		st := h.Stats()
		for o := dedup.Processed; o <= dedup.Cancelled; o++ {
			s.outcomes[o] += st.Count(o)
		}
		s.LocalDuplicates += st.LocalDuplicates
		s.StoreDuplicates += st.StoreDuplicates
	}
	return s
}

type sumStats struct {
	outcomes                         [dedup.Cancelled + 1]uint64
	LocalDuplicates, StoreDuplicates uint64
}

func (s sumStats) Count(o dedup.Outcome) uint64 { return s.outcomes[o] }

// ackStats sums the adapter's counters over the instances.
func (t *tally) ackStats() ackSum {
	t.mu.Lock()
	defer t.mu.Unlock()
	var s ackSum
	for _, a := range t.adapters {
		st := a.Stats()
		for act := dnats.ActNone; act <= dnats.ActTerm; act++ {
			s.actions[act] += st.Count(act)
		}
		s.AckErrors += st.AckErrors
	}
	return s
}

type ackSum struct {
	actions   [dnats.ActTerm + 1]uint64
	AckErrors uint64
}

func (s ackSum) Count(a dnats.Action) uint64 { return s.actions[a] }

// verify checks that every order ran exactly once per handler and nothing was
// terminated.
func verify(w io.Writer, tallies []*tally) error {
	var problems []string
	for _, t := range tallies {
		var never, twice int
		for i := range t.effects {
			switch n := t.effects[i].Load(); {
			case n == 0:
				never++
			case n > 1:
				twice++
			}
		}
		if never > 0 || twice > 0 {
			problems = append(problems, fmt.Sprintf("%s: %d orders never ran, %d ran more than once", t.name, never, twice))
		}
		if n := t.ackStats().Count(dnats.ActTerm); n > 0 {
			problems = append(problems, fmt.Sprintf("%s: %d messages terminated", t.name, n))
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	fmt.Fprintf(w, "ok: each of %d orders ran exactly once per handler (%s); nothing terminated\n",
		tallies[0].orders, handlerNames(tallies))
	return nil
}

func handlerNames(tallies []*tally) string {
	names := make([]string, len(tallies))
	for i, t := range tallies {
		names[i] = t.name
	}
	return strings.Join(names, ", ")
}
