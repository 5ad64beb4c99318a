// Command transactional bills orders exactly once: each order read from JetStream
// writes its billing row in a SQL transaction that also writes the order's dedup
// marker (dnats.TxHandler, package sqltx), so the row and "processed" commit together.
// Redis stays in front: the local tier and the claim answer known duplicates without
// a database round trip and keep two instances from billing one order at once.
//
// It publishes -orders orders, then republishes a share of them with the same
// Nats-Msg-Id once JetStream's duplicate window has passed (new messages to the
// stream), and runs three consumer instances that fail some first attempts (the
// transaction rolls back and the order comes again) and lose some acks (the order
// comes again after AckWait). Halfway through it deletes every dedup record in Redis,
// as a Redis restarted without persistence would: from then on the markers answer.
// It prints what happened, and exits non-zero unless every order has exactly one
// billing row.
//
// Bare, it runs on an in-process NATS server, an embedded miniredis and a SQLite file:
//
//	go run ./examples/transactional
//	go run ./examples/transactional -nats nats://127.0.0.1:4222 -redis 127.0.0.1:6379 \
//	    -postgres postgres://postgres@127.0.0.1:5432/test
//
// It deletes its stream, its records and its tables at exit.
package main

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/internal/embedded"
	dnats "github.com/dedupkit/dedupkit/nats"
	"github.com/dedupkit/dedupkit/sqltx"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "transactional:", err)
		os.Exit(1)
	}
}

const (
	instances = 3
	ackWait   = 2 * time.Second
	dupWindow = 500 * time.Millisecond // the stream's: republished ids after it are new messages
)

type config struct {
	natsURL, redisAddr, postgres  string
	orders                        int
	republish, failRate, lossRate float64
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	var c config
	fs := flag.NewFlagSet("transactional", flag.ContinueOnError)
	fs.StringVar(&c.natsURL, "nats", os.Getenv("DEDUP_NATS_URL"), "NATS URL (default: an in-process server)")
	fs.StringVar(&c.redisAddr, "redis", os.Getenv("DEDUP_REDIS_ADDR"), "Redis address (default: an embedded miniredis)")
	fs.StringVar(&c.postgres, "postgres", os.Getenv("DEDUP_POSTGRES_URL"), "PostgreSQL URL (default: a SQLite file)")
	fs.IntVar(&c.orders, "orders", 2000, "orders to bill")
	fs.Float64Var(&c.republish, "republish", 0.2, "share of the orders published again")
	fs.Float64Var(&c.failRate, "fail", 0.05, "share of first attempts that fail (rolled back, redelivered)")
	fs.Float64Var(&c.lossRate, "lose-acks", 0.02, "share of acks lost (redelivered after AckWait)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.orders < 1 || c.republish < 0 || c.republish > 1 || c.failRate < 0 || c.failRate >= 1 || c.lossRate < 0 || c.lossRate >= 1 {
		return errors.New("-orders must be positive, -republish in [0, 1], -fail and -lose-acks in [0, 1)")
	}
	id := runID()
	tmp, err := os.MkdirTemp("", "dedupkit-transactional-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	// Servers: the ones given, or embedded ones.
	if c.natsURL == "" {
		srv, err := embedded.StartNATS(filepath.Join(tmp, "nats"))
		if err != nil {
			return err
		}
		defer srv.Close()
		c.natsURL = srv.URL()
		fmt.Fprintln(stdout, "nats: in-process server")
	}
	var wipe func(context.Context) error // deletes every dedup record of the run
	prefix := "billing-" + id
	if c.redisAddr == "" {
		srv, err := embedded.StartRedis()
		if err != nil {
			return err
		}
		defer srv.Close()
		c.redisAddr = srv.Addr()
		fmt.Fprintln(stdout, "redis: embedded miniredis")
	}
	rdb := redis.NewClient(&redis.Options{Addr: c.redisAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	wipe = func(ctx context.Context) error { return embedded.DeleteKeys(ctx, rdb, prefix) }
	defer wipe(context.Background())

	driver, dsn, dialect := "sqlite", "file:"+filepath.Join(tmp, "billing.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)", sqltx.SQLite
	if c.postgres != "" {
		driver, dsn, dialect = "pgx", c.postgres, sqltx.PostgreSQL
		fmt.Fprintln(stdout, "database: PostgreSQL")
	} else {
		fmt.Fprintln(stdout, "database: SQLite file")
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	markers, billing := "dedup_markers_"+id, "billing_"+id
	tr, err := sqltx.New(db, dialect, sqltx.WithTable(markers))
	if err != nil {
		return err
	}
	defer tr.Close()
	if err := tr.Migrate(ctx); err != nil {
		return fmt.Errorf("create the marker table: %w", err)
	}
	// No unique constraint on purpose: a second row for an order is what dedup prevents.
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+billing+" (order_id VARCHAR(64) NOT NULL, cents INTEGER NOT NULL)"); err != nil {
		return err
	}
	defer func() {
		for _, t := range []string{billing, markers} {
			_, _ = db.ExecContext(context.Background(), "DROP TABLE "+t)
		}
	}()
	insert := "INSERT INTO " + billing + " (order_id, cents) VALUES (?, ?)"
	if dialect == sqltx.PostgreSQL {
		insert = "INSERT INTO " + billing + " (order_id, cents) VALUES ($1, $2)"
	}

	// The stream and its durable consumer.
	nc, err := natsgo.Connect(c.natsURL, natsgo.Name("dedupkit-transactional"))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	stream, subject := "BILLING_"+strings.ToUpper(id), "billing."+id
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject},
		Storage: jetstream.MemoryStorage, Duplicates: dupWindow, MaxAge: time.Hour}); err != nil {
		return fmt.Errorf("create stream: %w", err)
	}
	defer js.DeleteStream(context.Background(), stream)
	if _, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxDeliver: 50,
	}); err != nil {
		return fmt.Errorf("create consumer: %w", err)
	}

	// The consumer instances: each its own connection, Deduper and adapter, as
	// separate processes would have; one Redis, one database.
	var t tally
	ictx, stop := context.WithCancel(ctx)
	defer stop()
	var closers []func()
	defer func() {
		for _, f := range closers {
			f()
		}
	}()
	for i := range instances {
		cc, h, closeInstance, err := startInstance(ictx, i, c, tr, prefix, stream, insert, &t)
		if err != nil {
			return fmt.Errorf("instance %d: %w", i+1, err)
		}
		t.handlers = append(t.handlers, h)
		closers = append(closers, func() { cc.Stop(); <-cc.Closed(); closeInstance() })
	}

	// Publish, then republish a share once the duplicate window has passed.
	for i := range c.orders {
		if err := publish(ctx, js, subject, i); err != nil {
			return err
		}
	}
	time.Sleep(2 * dupWindow)
	republished := 0
	for i := range c.orders {
		if rand.Float64() < c.republish {
			if err := publish(ctx, js, subject, i); err != nil {
				return err
			}
			republished++
		}
	}
	fmt.Fprintf(stdout, "published %d orders, %d of them again with the same Nats-Msg-Id\n", c.orders, republished)

	// Halfway: Redis loses every record.
	wiped := false
	deadline := time.Now().Add(2 * time.Minute)
	cons, err := js.Consumer(ctx, stream, "billing")
	if err != nil {
		return err
	}
	for {
		if st := t.stats(); !wiped && st.Count(dedup.Processed) >= uint64(c.orders/2) {
			if err := wipe(ctx); err != nil {
				return err
			}
			wiped = true
			fmt.Fprintf(stdout, "after %d orders billed: every dedup record deleted from Redis\n", st.Count(dedup.Processed))
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return err
		}
		if wiped && info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not drained after 2 minutes: %d pending, %d awaiting an ack", info.NumPending, info.NumAckPending)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	for _, f := range closers {
		f()
	}
	closers = nil

	// Every order billed exactly once?
	rows, err := db.QueryContext(ctx, "SELECT order_id, COUNT(*) FROM "+billing+" GROUP BY order_id")
	if err != nil {
		return err
	}
	defer rows.Close()
	per := map[string]int{}
	for rows.Next() {
		var o string
		var n int
		if err := rows.Scan(&o, &n); err != nil {
			return err
		}
		per[o] = n
	}
	if err := rows.Err(); err != nil {
		return err
	}
	missing, twice := 0, 0
	for i := range c.orders {
		switch n := per[orderID(i)]; {
		case n == 0:
			missing++
		case n > 1:
			twice += n - 1
		}
	}
	st := t.stats()
	fmt.Fprintf(stdout, "deliveries %d: billed %d, duplicates %d (local tier %d, Redis %d, database markers %d), failed attempts rolled back %d, acks lost %d\n",
		t.deliveries.Load(), st.Count(dedup.Processed), st.Count(dedup.Duplicate), st.LocalDuplicates, st.StoreDuplicates,
		st.DatabaseDuplicates, t.failed.Load(), t.lost.Load())
	if missing != 0 || twice != 0 {
		return fmt.Errorf("%d orders without a billing row, %d extra rows", missing, twice)
	}
	fmt.Fprintf(stdout, "ok: each of %d orders billed exactly once\n", c.orders)
	return nil
}

// tally counts what the instances did.
type tally struct {
	deliveries, failed, lost atomic.Int64
	handlers                 []*dedup.Handler // one per instance

	mu       sync.Mutex
	attempts map[string]int
}

// sums is the instances' handler counters, added up.
type sums struct {
	processed, duplicate                                 uint64
	LocalDuplicates, StoreDuplicates, DatabaseDuplicates uint64
}

// Count returns the sum for Processed or Duplicate.
func (s sums) Count(o dedup.Outcome) uint64 {
	if o == dedup.Processed {
		return s.processed
	}
	return s.duplicate
}

// stats sums the instances' handler counters.
func (t *tally) stats() sums {
	var s sums
	for _, h := range t.handlers {
		st := h.Stats()
		s.processed += st.Count(dedup.Processed)
		s.duplicate += st.Count(dedup.Duplicate)
		s.LocalDuplicates += st.LocalDuplicates
		s.StoreDuplicates += st.StoreDuplicates
		s.DatabaseDuplicates += st.DatabaseDuplicates
	}
	return s
}

func (t *tally) attempt(order string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.attempts == nil {
		t.attempts = map[string]int{}
	}
	t.attempts[order]++
	return t.attempts[order]
}

// startInstance starts one consumer instance: a Deduper over the shared Redis, a
// transactional handler on Consume.
func startInstance(ctx context.Context, i int, c config, tr *sqltx.Transactor, prefix, stream, insert string, t *tally) (jetstream.ConsumeContext, *dedup.Handler, func(), error) {
	nc, err := natsgo.Connect(c.natsURL, natsgo.Name(fmt.Sprintf("dedupkit-transactional-%d", i+1)))
	if err != nil {
		return nil, nil, nil, err
	}
	rdb := redis.NewClient(&redis.Options{Addr: c.redisAddr, ContextTimeoutEnabled: true})
	closeAll := func() { rdb.Close(); nc.Close() }
	store, err := dedup.NewRedisStore(rdb)
	if err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	quiet := slog.New(slog.DiscardHandler)
	d, err := dedup.New(store, dedup.WithPrefix(prefix), dedup.WithLogger(quiet))
	if err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	closeAll = func() { d.Close(); rdb.Close(); nc.Close() }
	h, err := d.Register("billing", dedup.WithRetention(24*time.Hour), dedup.WithLease(5*time.Second))
	if err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	cons, err := js.Consumer(ctx, stream, "billing")
	if err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	a, err := dnats.NewJetStream(h, cons, dnats.WithLogger(quiet),
		dnats.WithBackoff(func(uint64) time.Duration { return 50 * time.Millisecond }))
	if err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	handle := dnats.TxHandler(ctx, a, tr, func(ctx context.Context, m *dnats.Msg, tx *sql.Tx) error {
		order := m.Header(jetstream.MsgIDHeader)
		if _, err := tx.ExecContext(ctx, insert, order, 1250); err != nil {
			return err
		}
		if t.attempt(order) == 1 && rand.Float64() < c.failRate {
			t.failed.Add(1)
			return errors.New("card declined: try again") // rolls back the row and the marker
		}
		return nil
	})
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		t.deliveries.Add(1)
		handle(lossyAck{Msg: msg, t: t, lose: rand.Float64() < c.lossRate})
	}, jetstream.PullHeartbeat(time.Second))
	if err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	return cc, h, func() { a.Wait(); closeAll() }, nil
}

// lossyAck is a delivery whose Ack may be lost on the way (the server redelivers
// after AckWait).
type lossyAck struct {
	jetstream.Msg
	t    *tally
	lose bool
}

func (m lossyAck) Ack() error {
	if m.lose {
		m.t.lost.Add(1)
		return nil
	}
	return m.Msg.Ack()
}

func publish(ctx context.Context, js jetstream.JetStream, subject string, i int) error {
	msg := natsgo.NewMsg(subject)
	msg.Data = []byte(fmt.Sprintf(`{"order":%d,"cents":1250}`, i))
	msg.Header.Set(jetstream.MsgIDHeader, orderID(i))
	_, err := js.PublishMsg(ctx, msg)
	return err
}

func orderID(i int) string { return fmt.Sprintf("order-%05d", i) }

func runID() string {
	var b [4]byte
	_, _ = crand.Read(b[:])
	return hex.EncodeToString(b[:])
}
