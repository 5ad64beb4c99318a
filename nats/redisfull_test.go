package nats

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/storekit"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// A full Redis under maxmemory-policy noeviction refuses new claims with an OOM
// error: the handler answers StoreUnavailable, fn does not run, and the adapter naks
// the message with a delay (a full Redis becomes a retry, not a silent duplicate).
// Once memory is freed, the redelivery runs it, once, and it is acked.
func TestFullRedisNaksUntilMemoryIsFreedThenRunsOnce(t *testing.T) {
	t.Parallel()
	rs := testenv.SpawnRedis(t, "--maxmemory-policy", "noeviction")
	ns := testenv.SpawnNATS(t)
	e := connect(t, ns.URL())
	e.newStream()
	cons := e.consumer("orders", func(c *jetstream.ConsumerConfig) { c.MaxDeliver = 50 })
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	t.Cleanup(func() { rdb.Close() })
	store, err := redisstore.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	prefix := testenv.Prefix()
	h := register(t, newDeduper(t, store, dedup.WithPrefix(prefix)), "orders", dedup.WithRetention(time.Hour))
	j := newJS(t, h, cons, WithStoreRetryDelay(100*time.Millisecond))
	ctx := context.Background()
	if res, err := h.Do(ctx, "warm-up", func(context.Context) error { return nil }); res.Outcome != dedup.Processed {
		t.Fatal(res.Outcome, err) // scripts loaded, connection open
	}

	// 1 MiB of padding of our own, then a maxmemory 128 KiB below what is used: Redis
	// is full (client buffers come and go, but not by that much) until the padding is
	// deleted
	pad := testenv.Prefix()
	for i := range 32 {
		if err := rdb.Set(ctx, pad+":"+strconv.Itoa(i), strings.Repeat("x", 32<<10), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	used, err := strconv.ParseInt(testenv.InfoField(t, rdb, "memory", "used_memory"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used-(128<<10), 10)).Err(); err != nil {
		t.Fatal(err)
	}

	var (
		mu      sync.Mutex
		results []dedup.Result
		acts    []Action
	)
	seen := func() ([]dedup.Result, []Action) {
		mu.Lock()
		defer mu.Unlock()
		return append([]dedup.Result(nil), results...), append([]Action(nil), acts...)
	}
	var r runs
	var calls handling // the callback records its result after its ack
	consume(t, cons, calls.wrap(func(msg jetstream.Msg) {
		res, act := j.Handle(ctx, msg, func(_ context.Context, m *Msg) error { r.add(m); return nil })
		mu.Lock()
		results, acts = append(results, res), append(acts, act)
		mu.Unlock()
	}))
	// what the handler got (Handle returns only the result): Redis's OOM error
	if _, err := storekit.Only(store.Claim(ctx, oneEntry(h.RecordKey("probe"), "probe", "", time.Second))); !errors.Is(err, dedup.ErrStoreUnavailable) || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("a claim on the full Redis: %v; want ErrStoreUnavailable with Redis's OOM error", err)
	}
	ack := e.publish("new", "order-1", "one")
	testenv.Eventually(t, 10*time.Second, "three deliveries answered", func() bool {
		res, _ := seen()
		return len(res) >= 3
	})
	res, act := seen()
	for i := range res {
		if res[i].Outcome != dedup.StoreUnavailable || act[i] != ActNakWithDelay {
			t.Fatalf("delivery %d on a full Redis: %v, %v; want store-unavailable, nak-with-delay", i+1, res[i].Outcome, act[i])
		}
	}
	if n := r.n.Load(); n != 0 {
		t.Fatalf("fn ran %d times on a full Redis", n)
	}

	testenv.DeletePrefix(t, rdb, pad) // free the memory
	ci := e.settled(cons, ack.Sequence)
	e.quietFor(cons, 2*testAckWait, ci.Delivered.Consumer)
	calls.wait()
	res, act = seen()
	t.Logf("%d deliveries: %d naked while Redis was full, then %v", len(res), len(res)-1, res[len(res)-1].Outcome)
	if last := len(res) - 1; res[last].Outcome != dedup.Processed || act[last] != ActAck {
		t.Fatalf("after memory was freed: %v, %v; want processed, ack", res[last].Outcome, act[last])
	}
	if n := r.of("order-1"); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
}
