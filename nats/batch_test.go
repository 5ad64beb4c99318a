package nats

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/storekit"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// A Fetch batch costs one store round trip for its claims, whatever its size, and one
// script per completion, each sent as its fn returns, coalesced with those out at
// once: counted on the Redis client, over miniredis and a real server.
func TestFetchBatchClaimsInOneRoundTrip(t *testing.T) {
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
				store, err := redisstore.New(client)
				if err != nil {
					t.Fatal(err)
				}
				h := register(t, newDeduper(t, store, dedup.WithPrefix(prefix)), "orders")
				j := newJS(t, h, c)
				ctx := context.Background()
				// warm the script cache, so that the count is the steady state (two
				// entries: a batch of one takes the single calls' command and script)
				warm := []driver.Entry{{Key: h.RecordKey("warm"), Token: "T", TTL: time.Minute}, {Key: h.RecordKey("warm2"), Token: "T", TTL: time.Minute}}
				for range 2 { // the second finds the first's claims: the claim_many script
					if _, err := store.Claim(ctx, warm); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := store.Complete(ctx, warm); err != nil {
					t.Fatal(err)
				}
				// and the complete script, which a completion of one entry sends
				one := oneEntry(h.RecordKey("warm3"), "T", "", time.Minute)
				if _, err := storekit.Only(store.Claim(ctx, one)); err != nil {
					t.Fatal(err)
				}
				if err := storekit.OnlyErr(store.Complete(ctx, one)); err != nil {
					t.Fatal(err)
				}
				for i := range done { // DONE in the store, not in this process's local tier
					if _, err := storekit.Only(store.Mark(ctx, oneEntry(h.RecordKey(fmt.Sprintf("order-%d", i)), "other", "", time.Hour))); err != nil {
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
				// the claims: a SET NX PX GET each, all in one round trip, and the
				// messages that found a record there (the DONE ones) in one claim_many
				// script call; then the completions as the fns return, coalesced: a SET
				// PX of DONE per message run, no script, in at most one round trip each
				completions := tc.Cmds() - n - 1
				if !strings.HasPrefix(tc.String(), fmt.Sprintf("set×%d, evalsha×1", n)) || strings.Count(tc.String(), "eval") != 1 ||
					completions != n-done || tc.Trips() < 3 || tc.Trips() > 2+completions {
					t.Fatalf("%d round trips carrying %d commands (%s); want the claims in the first two, then %d completions",
						tc.Trips(), tc.Cmds(), tc, n-done)
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

// ackWatch is a delivery whose Ack closes acked.
type ackWatch struct {
	jetstream.Msg
	acked chan struct{}
}

func (m ackWatch) Ack() error {
	err := m.Msg.Ack()
	close(m.acked)
	return err
}

// watchedBatch hands HandleBatch the deliveries of a Fetch batch, each an ackWatch.
type watchedBatch struct {
	jetstream.MessageBatch
	msgs []ackWatch
}

func (b *watchedBatch) Messages() <-chan jetstream.Msg {
	out := make(chan jetstream.Msg, 64)
	for msg := range b.MessageBatch.Messages() {
		w := ackWatch{Msg: msg, acked: make(chan struct{})}
		b.msgs = append(b.msgs, w)
		out <- w
	}
	close(out)
	return out
}

// In a Fetch batch each message is completed and acked as soon as its own fn returns,
// not when the batch ends: the fn of each message waits for the previous message's
// ack, and checks that its completion was answered first. With the completions held
// for the end of the batch, it would wait in vain.
func TestFetchBatchAcksEachMessageAsItsFnReturns(t *testing.T) {
	eachServer(t, func(t *testing.T, e *env) {
		e.newStream()
		const n = 5
		for i := range n {
			e.publish("new", fmt.Sprintf("order-%d", i), "x")
		}
		c := e.consumer("orders", func(cc *jetstream.ConsumerConfig) { cc.AckWait = 5 * time.Second })
		store := &countedCompletes{Store: memStore(t)}
		h := register(t, newDeduper(t, store), "orders")
		j := newJS(t, h, c)
		fetched, err := c.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		wb := &watchedBatch{MessageBatch: fetched}
		i := 0
		results, err := j.HandleBatch(context.Background(), wb, func(ctx context.Context, m *Msg) error {
			defer func() { i++ }()
			if i == 0 {
				return nil
			}
			select { // the previous message: completed, then acked
			case <-wb.msgs[i-1].acked:
				if got := store.answered.Load(); got != int64(i) {
					return fmt.Errorf("message %d acked with %d completions answered", i-1, got)
				}
				return nil
			case <-time.After(5 * time.Second):
				return fmt.Errorf("message %d not acked 5s after its fn returned", i-1)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		for k, r := range results {
			if r.Outcome != dedup.Processed {
				t.Errorf("message %d: %v %v", k, r.Outcome, r.Err)
			}
		}
	})
}

// countedCompletes counts the completions the store has answered.
type countedCompletes struct {
	driver.Store
	answered atomic.Int64
}

func (s *countedCompletes) Complete(ctx context.Context, entries []driver.Entry) ([]error, error) {
	errs, err := s.Store.Complete(ctx, entries)
	s.answered.Add(int64(len(entries)))
	return errs, err
}
