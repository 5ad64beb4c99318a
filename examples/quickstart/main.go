// Command quickstart guards two handlers with dedupkit while several workers receive
// every order more than once, as an at-least-once broker would deliver them. It runs on
// an embedded miniredis unless -redis names a server, prints what happened, and exits
// non-zero unless every order ran exactly once per handler.
//
//	go run ./examples/quickstart
//	go run ./examples/quickstart -redis 127.0.0.1:6379
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run() error {
	addr := flag.String("redis", os.Getenv("DEDUP_REDIS_ADDR"), "Redis address (default: an embedded miniredis)")
	orders := flag.Int("orders", 2000, "distinct orders")
	copies := flag.Int("copies", 3, "deliveries of each order")
	workers := flag.Int("workers", 8, "concurrent workers")
	keep := flag.Bool("keep", false, "keep this run's records in Redis (default: delete them at exit)")
	flag.Parse()

	if *addr == "" {
		srv, err := miniredis.Run()
		if err != nil {
			return err
		}
		defer srv.Close()
		*addr = srv.Addr()
		fmt.Println("redis: embedded miniredis at", *addr)
	} else {
		fmt.Println("redis:", *addr)
	}
	rdb := redis.NewClient(&redis.Options{Addr: *addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	store, err := redisstore.New(rdb)
	if err != nil {
		return err
	}
	// A prefix of our own per run: a shared Redis keeps other runs' records apart.
	prefix := fmt.Sprintf("quickstart-%d", time.Now().UnixNano())
	if !*keep {
		defer deletePrefix(rdb, prefix)
	}
	d, err := dedup.New(store, dedup.WithPrefix(prefix), dedup.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		return err
	}
	defer d.Close()

	// Two handlers see the same messages, each with its own retention.
	charge, err := d.Register("charge", dedup.WithRetention(72*time.Hour), dedup.WithLease(5*time.Second))
	if err != nil {
		return err
	}
	email, err := d.Register("email", dedup.WithRetention(time.Hour), dedup.WithMode(dedup.ModeFilter))
	if err != nil {
		return err
	}

	// Every order is delivered `copies` times, shuffled; the charge API fails now and
	// then, and the failed delivery goes back in the queue, as a broker's Nak would.
	queue := make(chan string, *orders**copies*2)
	var deliveries []string
	for i := 0; i < *orders; i++ {
		for c := 0; c < *copies; c++ {
			deliveries = append(deliveries, fmt.Sprintf("order-%05d", i))
		}
	}
	rand.Shuffle(len(deliveries), func(i, j int) { deliveries[i], deliveries[j] = deliveries[j], deliveries[i] })
	for _, k := range deliveries {
		queue <- k
	}
	var pending sync.WaitGroup
	pending.Add(len(deliveries))

	charged := make([]atomic.Int32, *orders)
	emailed := make([]atomic.Int32, *orders)
	var redelivered, flaky atomic.Int64
	outcomes := map[string]*atomic.Int64{}
	var mu sync.Mutex
	count := func(h string, o dedup.Outcome) {
		mu.Lock()
		c, ok := outcomes[h+" "+o.String()]
		if !ok {
			c = new(atomic.Int64)
			outcomes[h+" "+o.String()] = c
		}
		mu.Unlock()
		c.Add(1)
	}
	idx := func(k string) int { var n int; fmt.Sscanf(k, "order-%d", &n); return n }

	ctx := context.Background()
	var wg sync.WaitGroup
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for key := range queue {
				res, err := charge.Do(ctx, key, func(ctx context.Context) error {
					if rand.IntN(20) == 0 {
						flaky.Add(1)
						return errors.New("payment API timeout")
					}
					charged[idx(key)].Add(1)
					return nil
				})
				count("charge", res.Outcome)
				switch res.Outcome {
				case dedup.Failed, dedup.InProgress, dedup.StoreUnavailable:
					redelivered.Add(1)
					// redeliver later, as a broker's NakWithDelay would
					time.AfterFunc(time.Millisecond, func() { queue <- key })
					continue
				case dedup.Processed, dedup.Duplicate:
				default:
					fmt.Fprintln(os.Stderr, "charge:", res.Outcome, err)
				}
				res, _ = email.Handle(ctx, orderMsg(key), func(context.Context) error {
					emailed[idx(key)].Add(1)
					return nil
				})
				count("email", res.Outcome)
				pending.Done()
			}
		}()
	}
	pending.Wait()
	close(queue)
	wg.Wait()

	var bad int
	for i := range charged {
		if charged[i].Load() != 1 || emailed[i].Load() != 1 {
			bad++
		}
	}
	fmt.Printf("orders %d, deliveries %d, redelivered %d (of which handler errors %d)\n",
		*orders, len(deliveries), redelivered.Load(), flaky.Load())
	for _, h := range []*dedup.Handler{charge, email} {
		st := h.Stats()
		fmt.Printf("%-7s processed %5d  first %5d  duplicates %5d (local %5d, redis %5d)  in-progress %4d  failed %4d\n",
			h.Name(), st.Count(dedup.Processed), st.Count(dedup.First), st.Count(dedup.Duplicate),
			st.LocalDuplicates, st.StoreDuplicates, st.Count(dedup.InProgress), st.Count(dedup.Failed))
	}
	if bad > 0 {
		return fmt.Errorf("%d orders did not run exactly once per handler", bad)
	}
	fmt.Println("ok: every order charged once and emailed once")
	return nil
}

// deletePrefix removes this run's records (SCAN and DEL: never FLUSHDB on a shared Redis).
func deletePrefix(rdb *redis.Client, prefix string) {
	ctx := context.Background()
	iter := rdb.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		if batch = append(batch, iter.Val()); len(batch) == 1000 {
			rdb.Unlink(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		rdb.Unlink(ctx, batch...)
	}
}
