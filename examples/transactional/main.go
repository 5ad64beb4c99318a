// Command transactional bills orders from JetStream exactly once: each billing row is
// written in a SQL transaction with the order's dedup marker (dnats.TxHandler, sqltx),
// so row and "processed" commit together; the marker's row keeps two instances from
// billing one order at once, and Redis gets a DONE record of each. Orders come again
// (after a failed attempt rolled back, or republished once Redis lost every record:
// the markers answer). It exits non-zero unless every order has exactly one row. Bare,
// it runs on in-process servers and SQLite; it deletes its stream, records and tables.
//
//	go run ./examples/transactional
//	go run ./examples/transactional -nats nats://127.0.0.1:4222 -redis 127.0.0.1:6379 \
//	    -postgres postgres://postgres@127.0.0.1:5432/test
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/dedupkittest"
	dnats "github.com/dedupkit/dedupkit/nats"
	"github.com/dedupkit/dedupkit/sqltx"
)

func main() {
	if _, err := run(context.Background(), os.Args[1:], os.Stdout); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "transactional:", err)
		os.Exit(1)
	}
}

// run bills the orders and returns the instances' handlers, for the tests.
func run(ctx context.Context, args []string, stdout io.Writer) ([]*dedup.Handler, error) {
	fs := flag.NewFlagSet("transactional", flag.ContinueOnError)
	natsURL := fs.String("nats", os.Getenv("DEDUP_NATS_URL"), "NATS URL (default: in-process; env DEDUP_NATS_URL)")
	redisAddr := fs.String("redis", os.Getenv("DEDUP_REDIS_ADDR"), "Redis address (default: embedded; env DEDUP_REDIS_ADDR)")
	postgres := fs.String("postgres", os.Getenv("DEDUP_POSTGRES_URL"), "PostgreSQL URL (default: a SQLite file; env DEDUP_POSTGRES_URL)")
	orders := fs.Int("orders", 2000, "orders to bill")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 || *orders < 2 {
		return nil, cmp.Or(err, errors.New("want -orders of 2 or more, and no arguments"))
	}
	srv, err := dedupkittest.StartServers(*natsURL, *redisAddr)
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	id := strings.ToLower(rand.Text()[:8]) // names of this run's own
	fmt.Fprintf(stdout, "run %s on %s\n", id, srv)
	rdb := redis.NewClient(&redis.Options{Addr: srv.RedisAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	prefix := "billing-" + id
	defer dedupkittest.DeleteKeys(context.Background(), rdb, prefix) // SCAN and UNLINK, never FLUSHDB

	// The database: PostgreSQL, or a SQLite file with a busy timeout.
	driver, dsn, dialect, insert := "pgx", *postgres, sqltx.PostgreSQL, "INSERT INTO billing_"+id+" (order_id, cents) VALUES ($1, $2)"
	if *postgres == "" {
		dir, err := os.MkdirTemp("", "dedupkit-transactional-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		driver, dialect = "sqlite", sqltx.SQLite
		dsn = "file:" + filepath.Join(dir, "billing.db") + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)"
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	tr, err := sqltx.New(db, dialect, sqltx.WithTable("dedup_markers_"+id))
	if err != nil {
		return nil, err
	}
	defer db.ExecContext(context.Background(), "DROP TABLE dedup_markers_"+id)
	defer db.ExecContext(context.Background(), "DROP TABLE billing_"+id)
	if err := tr.Migrate(ctx); err != nil {
		return nil, err
	}
	// No unique constraint on purpose: a second row for an order is what dedup prevents.
	if _, err := db.ExecContext(ctx, "CREATE TABLE billing_"+id+" (order_id VARCHAR(64) NOT NULL, cents INTEGER NOT NULL)"); err != nil {
		return nil, err
	}

	// A stream whose duplicate window is short, so that the republished orders come soon.
	nc, err := natsgo.Connect(srv.NATSURL)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	stream, subject := "BILLING_"+strings.ToUpper(id), "billing."+id
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject},
		Storage: jetstream.MemoryStorage, Duplicates: 500 * time.Millisecond, MaxAge: time.Hour}); err != nil {
		return nil, err
	}
	defer js.DeleteStream(context.Background(), stream)
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "billing",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second, MaxDeliver: 50})
	if err != nil {
		return nil, err
	}

	// Three instances, as separate processes would be: each a Deduper and a consumer.
	// The first attempt of every 20th order fails after its insert: the transaction
	// rolls back, row and marker, and the order comes again.
	bill := func(ctx context.Context, m *dnats.Msg, tx *sql.Tx) error {
		order := m.Header(jetstream.MsgIDHeader)
		if _, err := tx.ExecContext(ctx, insert, order, 1250); err != nil {
			return err
		}
		if seq, _ := strconv.Atoi(order); seq%20 == 1 && m.NumDelivered() == 1 {
			return errors.New("card declined: try again")
		}
		return nil
	}
	var handlers []*dedup.Handler
	quiet := slog.New(slog.DiscardHandler) // the lease lost to the wipe would fill the log
	for range 3 {
		store, err := redisstore.New(rdb)
		if err != nil {
			return nil, err
		}
		d, err := dedup.New(store, dedup.WithPrefix(prefix), dedup.WithLogger(quiet))
		if err != nil {
			return nil, err
		}
		defer d.Close()
		h, err := d.Register("billing", dedup.WithRetention(24*time.Hour), dedup.WithLease(5*time.Second))
		if err != nil {
			return nil, err
		}
		a, err := dnats.NewJetStream(h, cons)
		if err != nil {
			return nil, err
		}
		cc, err := cons.Consume(dnats.TxHandler(ctx, a, tr, bill), jetstream.PullHeartbeat(time.Second))
		if err != nil {
			return nil, err
		}
		defer func() { cc.Stop(); <-cc.Closed(); a.Wait() }()
		handlers = append(handlers, h)
	}

	// Publish every order. Then Redis loses every record, as when restarted without
	// persistence, and the first fifth is published again past the duplicate window:
	// the markers answer for them (or a local tier that still holds them).
	for i := range *orders + *orders/5 {
		if i == *orders {
			if err := dedupkittest.DeleteKeys(ctx, rdb, prefix); err != nil {
				return nil, err
			}
			time.Sleep(time.Second)
		}
		msg := natsgo.NewMsg(subject)
		msg.Header.Set(jetstream.MsgIDHeader, strconv.Itoa(i%*orders)) // the order id
		msg.Data = fmt.Appendf(nil, `{"order":%d,"cents":1250}`, i%*orders)
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			return nil, err
		}
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		info, err := cons.Info(ctx)
		if err != nil || time.Now().After(deadline) {
			return handlers, cmp.Or(err, errors.New("the consumer is not drained after 2 minutes"))
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
	}

	// Every order billed exactly once?
	var missing, extra int
	err = db.QueryRowContext(ctx, "SELECT COUNT(DISTINCT order_id), COUNT(*) - COUNT(DISTINCT order_id) FROM billing_"+id).Scan(&missing, &extra)
	if missing = *orders - missing; err != nil || missing != 0 || extra != 0 {
		return handlers, cmp.Or(err, fmt.Errorf("%d orders without a billing row, %d extra rows", missing, extra))
	}
	fmt.Fprintf(stdout, "ok: each of %d orders billed exactly once\n", *orders)
	return handlers, nil
}
