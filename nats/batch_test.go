package nats

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// A Fetch batch costs one store round trip for its claims and one for its completions,
// whatever its size: counted on the Redis client, over miniredis and a real server.
func TestFetchBatchIsTwoRoundTrips(t *testing.T) {
	const n, done = 10, 3 // messages, and how many of them are already DONE
	eachServer(t, func(t *testing.T, e *env) {
		e.newStream()
		var last *jetstream.PubAck
		for i := range n {
			last = e.publish("new", fmt.Sprintf("order-%d", i), "x")
		}
		for name, mk := range redisClients() {
			t.Run(name, func(t *testing.T) {
				client, prefix := mk(t)
				// a consumer per case: each fetches every message of the stream
				c := e.consumer(name, func(cc *jetstream.ConsumerConfig) { cc.AckWait = 5 * time.Second })
				tc := &testenv.TripCounter{}
				client.AddHook(tc)
				store, err := dedup.NewRedisStore(client)
				if err != nil {
					t.Fatal(err)
				}
				h := register(t, newDeduper(t, store, dedup.WithPrefix(prefix)), "orders")
				j := newJS(t, h, c)
				ctx := context.Background()
				// warm the script cache, so that the count is the steady state
				if _, err := store.ClaimMany(ctx, []dedup.Entry{{Key: h.RecordKey("warm"), Token: "T", TTL: time.Minute}}); err != nil {
					t.Fatal(err)
				}
				if err := store.Complete(ctx, h.RecordKey("warm"), "T", time.Minute); err != nil {
					t.Fatal(err)
				}
				for i := range done { // DONE in the store, not in this process's local tier
					if _, err := store.Mark(ctx, h.RecordKey(fmt.Sprintf("order-%d", i)), "other", "", time.Hour); err != nil {
						t.Fatal(err)
					}
				}
				batch, err := c.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				tc.Reset()
				ran := 0
				results, err := j.HandleBatch(ctx, batch, func(context.Context, *Msg) error { ran++; return nil })
				if err != nil {
					t.Fatal(err)
				}
				if len(results) != n || ran != n-done {
					t.Fatalf("%d results, %d runs; want %d and %d", len(results), ran, n, n-done)
				}
				// a claim is SET NX PX GET, PTTL and GET; a completion one script
				if tc.Trips() != 2 || tc.Cmds() != 3*n+n-done {
					t.Fatalf("%d round trips carrying %d commands (%s); want 2 carrying %d", tc.Trips(), tc.Cmds(), tc, 3*n+n-done)
				}
				for i, r := range results {
					want := dedup.Processed
					if i < done {
						want = dedup.Duplicate
					}
					if r.Outcome != want {
						t.Fatalf("item %d: %v, want %v", i, r.Outcome, want)
					}
				}
				if j.Stats().Count(ActAck) != n {
					t.Fatalf("%d acks, want %d", j.Stats().Count(ActAck), n)
				}
				e.settled(c, last.Sequence)
			})
		}
	})
}
