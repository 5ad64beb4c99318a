package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/keys"
)

// Guard a handler so a redelivered message does not run it twice.
func Example() {
	store, _ := memstore.New()
	d, _ := dedup.New(store)
	defer d.Close()
	charge, _ := d.Register("charge-card", dedup.WithRetention(72*time.Hour))

	ctx := context.Background()
	for _, orderID := range []string{"order-1", "order-2", "order-1"} {
		res, err := charge.Do(ctx, orderID, func(ctx context.Context) error {
			fmt.Println("charging", orderID)
			return nil
		})
		fmt.Println(orderID, res.Outcome, res.Tier, err)
	}
	// Output:
	// charging order-1
	// order-1 processed none <nil>
	// charging order-2
	// order-2 processed none <nil>
	// order-1 duplicate local <nil>
}

// A failed handler releases its claim, so the redelivery runs it again.
func ExampleHandler_Do_retry() {
	store, _ := memstore.New()
	d, _ := dedup.New(store)
	defer d.Close()
	h, _ := d.Register("ship")

	ctx := context.Background()
	attempt := 0
	for i := 0; i < 3; i++ {
		res, err := h.Do(ctx, "parcel-9", func(context.Context) error {
			attempt++
			if attempt == 1 {
				return errors.New("carrier API down")
			}
			return nil
		})
		fmt.Println(res.Outcome, err)
	}
	// Output:
	// failed carrier API down
	// processed <nil>
	// duplicate <nil>
}

// Filter mode: one round trip per message, no lease.
func ExampleHandler_Mark() {
	store, _ := memstore.New()
	d, _ := dedup.New(store)
	defer d.Close()
	h, _ := d.Register("page-views", dedup.WithMode(dedup.ModeFilter), dedup.WithRetention(time.Hour))

	for _, id := range []string{"ev-1", "ev-1", "ev-2"} {
		res, _ := h.Mark(context.Background(), id)
		fmt.Println(id, res.Outcome)
	}
	// Output:
	// ev-1 first
	// ev-1 duplicate
	// ev-2 first
}

// Handle reads the key from the message with the handler's key strategy; with
// fingerprinting on, a reused key with another payload is reported, not dropped.
func ExampleHandler_Handle() {
	store, _ := memstore.New()
	d, _ := dedup.New(store)
	defer d.Close()
	h, _ := d.Register("payments",
		dedup.WithKeyStrategy(keys.Header("Idempotency-Key")),
		dedup.WithFingerprint(true))

	msgs := []keys.Raw{
		{Headers: map[string]string{"Idempotency-Key": "pay-1"}, Body: []byte(`{"amount":10}`)},
		{Headers: map[string]string{"Idempotency-Key": "pay-1"}, Body: []byte(`{"amount":10}`)},
		{Headers: map[string]string{"Idempotency-Key": "pay-1"}, Body: []byte(`{"amount":99}`)},
		{Body: []byte(`{"amount":5}`)},
	}
	for _, m := range msgs {
		res, _ := h.Handle(context.Background(), m, func(context.Context) error { return nil })
		fmt.Println(res.Outcome)
	}
	// Output:
	// processed
	// duplicate
	// key-reuse
	// no-key
}

// A request retried after a timeout gets the first run's reply, not silence: on a
// handler WithReplies, the reply fn sets (SetReply) is stored with DONE, and Run
// hands it back to every duplicate.
func ExampleSetReply() {
	store, _ := memstore.New()
	d, _ := dedup.New(store)
	defer d.Close()
	create, _ := d.Register("create-order", dedup.WithReplies(0)) // replies up to 64 KiB

	ctx := context.Background()
	for _, requestID := range []string{"req-1", "req-1"} { // the client retried
		res := create.Run(ctx, []dedup.Item{{Key: requestID}}, func(ctx context.Context, _ int) error {
			fmt.Println("creating the order")
			return dedup.SetReply(ctx, []byte(`{"order":"o-42"}`))
		})[0]
		fmt.Println(res.Outcome, res.Reply, res.Err)
	}
	// Output:
	// creating the order
	// processed {"order":"o-42"} <nil>
	// duplicate {"order":"o-42"} <nil>
}
