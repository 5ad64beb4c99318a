package dedupkit_test

// The README's recipes. Each README code block names the function it shows, and
// TestReadmeCode fails when the two differ; the Examples below run each recipe on
// embedded servers (an in-process NATS server, miniredis, SQLite), so that the README's
// code compiles against today's API and does what its text says.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/dedupkittest"
	dnats "github.com/dedupkit/dedupkit/nats"
	"github.com/dedupkit/dedupkit/sqltx"
)

// consumeOrders runs the inventory handler on the ORDERS stream's inventory consumer
// until ctx is cancelled.
func consumeOrders(ctx context.Context, js jetstream.JetStream, rdb redis.UniversalClient) error {
	store, err := redisstore.New(rdb) // build rdb with ContextTimeoutEnabled: true
	if err != nil {
		return err
	}
	d, err := dedup.New(store)
	if err != nil {
		return err
	}
	defer d.Close()
	inventory, err := d.Register("inventory", dedup.WithRetention(72*time.Hour))
	if err != nil {
		return err
	}
	cons, err := js.Consumer(ctx, "ORDERS", "inventory")
	if err != nil {
		return err
	}
	adapter, err := dnats.NewJetStream(inventory, cons) // refuses a retention shorter than redelivery, or MaxDeliver -1
	if err != nil {
		return err
	}
	cc, err := cons.Consume(adapter.Handler(ctx, func(ctx context.Context, m *dnats.Msg) error {
		return reserveStock(ctx, m.Data()) // once per Idempotency-Key, else Nats-Msg-Id, else stream sequence
	}), jetstream.PullHeartbeat(time.Second)) // see docs/nats.md, Operational notes
	if err != nil {
		return err
	}
	<-ctx.Done()
	cc.Stop()
	<-cc.Closed()
	adapter.Wait() // the messages in hand, before d.Close
	return nil
}

// openMarkers opens the marker table on PostgreSQL; sqltx.MySQL and sqltx.SQLite alike.
func openMarkers(ctx context.Context, url string) (*sqltx.Transactor, error) {
	db, err := sql.Open("pgx", url) // import _ "github.com/jackc/pgx/v5/stdlib"
	if err != nil {
		return nil, err
	}
	markers, err := sqltx.New(db, sqltx.PostgreSQL) // pgxtx.New(pool) for pgx's own pool
	if err != nil {
		return nil, err
	}
	return markers, markers.Migrate(ctx) // or put markers.Schema() in a migration
}

// billOrders runs the billing handler on the ORDERS stream's billing consumer until ctx
// is cancelled: each order's payment row and its marker commit in one transaction.
func billOrders(ctx context.Context, js jetstream.JetStream, d *dedup.Deduper, markers *sqltx.Transactor) error {
	billing, err := d.Register("billing", dedup.WithRetention(72*time.Hour))
	if err != nil {
		return err
	}
	cons, err := js.Consumer(ctx, "ORDERS", "billing")
	if err != nil {
		return err
	}
	adapter, err := dnats.NewJetStream(billing, cons)
	if err != nil {
		return err
	}
	cc, err := cons.Consume(dnats.TxHandler(ctx, adapter, markers, func(ctx context.Context, m *dnats.Msg, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO payments (order_id) VALUES ($1)`, string(m.Data()))
		return err // an error or a panic rolls back the row and the marker
	}), jetstream.PullHeartbeat(time.Second))
	if err != nil {
		return err
	}
	<-ctx.Done()
	cc.Stop()
	<-cc.Closed()
	adapter.Wait()
	return nil
}

// serveOrders adds an idempotent endpoint to a nats.go/micro service: a client that
// retries a request with the same Idempotency-Key gets the first run's reply.
func serveOrders(ctx context.Context, nc *nats.Conn, d *dedup.Deduper) (micro.Service, error) {
	create, err := d.Register("create-order", dedup.WithReplies(0)) // replies up to 64 KiB
	if err != nil {
		return nil, err
	}
	orders, err := dnats.NewReplier(create)
	if err != nil {
		return nil, err
	}
	svc, err := micro.AddService(nc, micro.Config{Name: "orders", Version: "1.0.0"})
	if err != nil {
		return nil, err
	}
	return svc, svc.AddEndpoint("create", orders.MicroHandler(ctx, createOrder))
}

func createOrder(ctx context.Context, m *dnats.Msg) (dnats.Reply, error) {
	id, err := placeOrder(ctx, m.Data())
	if err != nil { // a *dnats.ServiceError chooses the error reply's code
		return dnats.Reply{}, err // else 500; the claim is released, and a retry runs again
	}
	return dnats.Reply{Header: nats.Header{"Order-Id": {id}}, Data: []byte("created " + id)}, nil
}

// The application's side of the recipes: what they call, recorded for the Examples.
var (
	mu      sync.Mutex
	effects []string
)

func record(effect string) int {
	mu.Lock()
	defer mu.Unlock()
	effects = append(effects, effect)
	return len(effects)
}

// recorded returns the effects so far, sorted, and forgets them.
func recorded() []string {
	mu.Lock()
	defer mu.Unlock()
	e := effects
	effects = nil
	sort.Strings(e)
	return e
}

func reserveStock(_ context.Context, order []byte) error {
	record("reserve " + string(order))
	return nil
}

func placeOrder(_ context.Context, req []byte) (string, error) {
	if string(req) == "sku-0" {
		return "", &dnats.ServiceError{Code: "404", Description: "unknown sku"}
	}
	return fmt.Sprintf("o-%d", record("place "+string(req))), nil
}

// startJetStream starts an in-process NATS server with an ORDERS stream and the
// durable consumers named, and publishes orders, each with its Idempotency-Key.
func startJetStream(consumers []string, orders ...string) (js jetstream.JetStream, stop func(), err error) {
	dir, err := os.MkdirTemp("", "readme")
	if err != nil {
		return nil, nil, err
	}
	srv, err := dedupkittest.StartNATS(dir)
	if err != nil {
		return nil, nil, err
	}
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		return nil, nil, err
	}
	stop = func() { nc.Close(); srv.Close(); os.RemoveAll(dir) }
	js, _ = jetstream.New(nc)
	ctx := context.Background()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	if err != nil {
		stop()
		return nil, nil, err
	}
	for _, name := range consumers {
		if _, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: name,
			AckPolicy: jetstream.AckExplicitPolicy, AckWait: 10 * time.Second, MaxDeliver: 5}); err != nil {
			stop()
			return nil, nil, err
		}
	}
	for _, id := range orders {
		msg := nats.NewMsg("orders.new")
		msg.Header.Set("Idempotency-Key", id)
		msg.Data = []byte(id)
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			stop()
			return nil, nil, err
		}
	}
	return js, stop, nil
}

// drained waits until every consumer named has acked every message of the stream:
// its ack floor has reached the stream's last message (pending counts alone can read
// zero before the consumer has caught up with the stream).
func drained(js jetstream.JetStream, consumers ...string) error {
	ctx := context.Background()
	stream, err := js.Stream(ctx, "ORDERS")
	if err != nil {
		return err
	}
	sinfo, err := stream.Info(ctx)
	if err != nil {
		return err
	}
	last := sinfo.State.LastSeq
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		done := true
		for _, name := range consumers {
			cons, err := js.Consumer(ctx, "ORDERS", name)
			if err != nil {
				return err
			}
			info, err := cons.Info(ctx)
			if err != nil {
				return err
			}
			done = done && info.AckFloor.Stream >= last && info.NumAckPending == 0
		}
		if done {
			return nil
		}
	}
	return errors.New("not drained in 10 s")
}

// order-1 is published twice (a publisher's retry), and reserved once.
func Example_jetStream() {
	js, stop, err := startJetStream([]string{"inventory"}, "order-1", "order-2", "order-1")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- consumeOrders(ctx, js, rdb) }()
	if err := drained(js, "inventory"); err != nil {
		fmt.Println(err)
	}
	cancel()
	fmt.Println(<-done, strings.Join(recorded(), ", "))
	// Output:
	// <nil> reserve order-1, reserve order-2
}

// order-1 is published twice, and billed once: one payment row.
func Example_jetStreamTransactional() {
	js, stop, err := startJetStream([]string{"billing"}, "order-1", "order-2", "order-1")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()
	dir, _ := os.MkdirTemp("", "readme-sql")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	defer db.Close()
	ctx, cancel := context.WithCancel(context.Background())
	markers, _ := sqltx.New(db, sqltx.SQLite) // openMarkers on PostgreSQL: TestReadmeOpenMarkers
	defer markers.Close()
	_ = markers.Migrate(ctx)
	_, _ = db.ExecContext(ctx, `CREATE TABLE payments (order_id TEXT)`)
	store, _ := memstore.New()
	d, _ := dedup.New(store)
	defer d.Close()

	done := make(chan error, 1)
	go func() { done <- billOrders(ctx, js, d, markers) }()
	if err := drained(js, "billing"); err != nil {
		fmt.Println(err)
	}
	cancel()
	fmt.Println(<-done)
	rows, _ := db.Query(`SELECT order_id, count(*) FROM payments GROUP BY order_id ORDER BY order_id`)
	defer rows.Close()
	for rows.Next() {
		var id string
		var n int
		_ = rows.Scan(&id, &n)
		fmt.Println(id, n)
	}
	// Output:
	// <nil>
	// order-1 1
	// order-2 1
}

// A request retried with the same Idempotency-Key gets the first run's reply; the
// order is placed once.
func Example_requestReply() {
	dir, _ := os.MkdirTemp("", "readme")
	defer os.RemoveAll(dir)
	srv, _ := dedupkittest.StartNATS(dir)
	defer srv.Close()
	nc, _ := nats.Connect(srv.URL())
	defer nc.Close()
	store, _ := memstore.New()
	d, _ := dedup.New(store)
	defer d.Close()

	svc, err := serveOrders(context.Background(), nc, d)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer svc.Stop()
	for _, req := range []struct{ key, body string }{{"req-1", "sku-7"}, {"req-1", "sku-7"}, {"req-2", "sku-0"}} {
		msg := nats.NewMsg("create")
		msg.Header.Set("Idempotency-Key", req.key)
		msg.Data = []byte(req.body)
		reply, err := nc.RequestMsg(msg, 5*time.Second)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Printf("%s: %q Order-Id=%s error=%s\n", req.key, reply.Data, reply.Header.Get("Order-Id"), reply.Header.Get(micro.ErrorCodeHeader))
	}
	fmt.Println(recorded())
	// Output:
	// req-1: "created o-1" Order-Id=o-1 error=
	// req-1: "created o-1" Order-Id=o-1 error=
	// req-2: "" Order-Id= error=404
	// [place sku-7]
}

// The README's openMarkers on a real PostgreSQL (DEDUP_POSTGRES_URL).
func TestReadmeOpenMarkers(t *testing.T) {
	url := os.Getenv("DEDUP_POSTGRES_URL")
	if url == "" {
		t.Skip("DEDUP_POSTGRES_URL is not set")
	}
	markers, err := openMarkers(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	markers.Close()
}
