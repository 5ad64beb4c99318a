package nats_test

import (
	"context"
	"fmt"
	"os"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/internal/embedded"
	"github.com/dedupkit/dedupkit/keys"
	dnats "github.com/dedupkit/dedupkit/nats"
)

// Wrap a JetStream consumer: each order runs once, however often it is stored.
func ExampleNewJetStream() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	srv, _ := embedded.StartNATS(dir)
	defer srv.Close()
	nc, _ := natsgo.Connect(srv.URL())
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	stream, _ := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	cons, _ := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "inventory", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 10 * time.Second, MaxDeliver: 5,
	})

	store, _ := memstore.New() // redisstore.New(rdb) across processes
	d, _ := dedup.New(store)
	defer d.Close()
	inventory, _ := d.Register("inventory", dedup.WithRetention(time.Hour),
		dedup.WithKeyStrategy(keys.Header("Order-Id")))
	adapter, err := dnats.NewJetStream(inventory, cons)
	if err != nil {
		fmt.Println(err)
		return
	}

	// order-1 is published twice: a publisher retry the server's window did not catch
	for _, id := range []string{"order-1", "order-2", "order-1"} {
		msg := natsgo.NewMsg("orders.new")
		msg.Header.Set("Order-Id", id)
		msg.Data = []byte(id)
		js.PublishMsg(ctx, msg)
	}
	batch, _ := cons.Fetch(3, jetstream.FetchMaxWait(time.Second))
	results, _ := adapter.HandleBatch(ctx, batch, func(ctx context.Context, m *dnats.Msg) error {
		fmt.Println("reserving stock for", string(m.Data()))
		return nil
	})
	for _, r := range results {
		fmt.Println(r.Outcome)
	}
	fmt.Println("acks:", adapter.Stats().Count(dnats.ActAck))
	// Output:
	// reserving stock for order-1
	// reserving stock for order-2
	// processed
	// processed
	// duplicate
	// acks: 3
}

// A too-short retention is refused: the consumer could redeliver after it expires.
func ExampleCheckRetention() {
	err := dnats.CheckRetention(time.Minute, jetstream.ConsumerConfig{AckWait: 30 * time.Second, MaxDeliver: 5}, false)
	fmt.Println(err)
	// Output:
	// nats: retention shorter than the redelivery horizon: dedup: invalid option: retention 1m0s < AckWait 30s × MaxDeliver 5 + BackOff total 0s = 2m30s
}
