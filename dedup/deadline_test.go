package dedup

import (
	"context"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/testenv"
	"github.com/dedupkit/dedupkit/keys"
)

// Against a Redis that accepts connections and never answers, through a go-redis
// client built as most are (no ContextTimeoutEnabled: the client alone would wait out
// its ReadTimeout and retries, 5 s and more), every call that takes a context returns
// by its deadline (a transactional run, which does not wait for the store, well
// before it), Register does not touch the network, and Close returns within closeWait
// and a little, with a call still out that has no deadline at all, or a transactional
// run's DONE record.
func TestEveryCallReturnsByItsDeadlineAgainstASilentRedis(t *testing.T) {
	for name, opts := range map[string]*redis.Options{
		"default client":           {},
		"ContextTimeoutEnabled":    {ContextTimeoutEnabled: true},
		"no retries, long timeout": {MaxRetries: -1, ReadTimeout: time.Minute},
		"no read deadline at all":  {ReadTimeout: -2, WriteTimeout: -2},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			opts.Addr = testenv.SilentAddr(t)
			rdb := redis.NewClient(opts)
			t.Cleanup(func() { rdb.Close() })
			store, err := redisstore.New(rdb)
			if err != nil {
				t.Fatal(err)
			}
			// a Deduper for each call, so that none finds the breaker open (a later
			// test shows calls refused at once when it is)
			type handlers struct {
				d                  *Deduper
				h, filter, replies *Handler
			}
			var closing sync.WaitGroup
			fresh := func() handlers {
				d, err := New(store, WithPrefix(testenv.Prefix()), WithLogger(quiet))
				if err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				h, err := d.Register("orders") // a local tier: subscribes to forget notices
				if err != nil {
					t.Fatal(err)
				}
				if took := time.Since(start); took > 100*time.Millisecond {
					t.Errorf("Register took %v: it must not wait for the network", took)
				}
				filter, _ := d.Register("filter", WithMode(ModeFilter))
				replies, _ := d.Register("replies", WithReplies(0))
				return handlers{d, h, filter, replies}
			}
			db := newFakeDB()
			noop := func(context.Context) error { return nil }
			items := []Item{{Key: "b1"}, {Key: "b2"}}
			calls := []struct {
				name string
				call func(ctx context.Context, hs handlers)
			}{
				{"Do", func(ctx context.Context, hs handlers) { _, _ = hs.h.Do(ctx, "k1", noop) }},
				{"Handle", func(ctx context.Context, hs handlers) {
					_, _ = hs.h.Handle(ctx, keys.Raw{Headers: map[string]string{"Idempotency-Key": "k2"}}, noop)
				}},
				{"Mark", func(ctx context.Context, hs handlers) { _, _ = hs.filter.Mark(ctx, "k3") }},
				{"HandleKey, filter", func(ctx context.Context, hs handlers) { _, _ = handleKey(hs.filter, ctx, "k4", nil, noop) }},
				{"DoReply", func(ctx context.Context, hs handlers) {
					_, _ = runReply(hs.replies, ctx, "k5", nil, func(context.Context) ([]byte, error) { return nil, nil })
				}},
				{"HandleBatch", func(ctx context.Context, hs handlers) {
					_ = hs.h.Run(ctx, items, func(context.Context, int) error { return nil })
				}},
				{"HandleBatchParallel", func(ctx context.Context, hs handlers) {
					_ = hs.h.Run(ctx, items, func(context.Context, int) error { return nil }, Parallel(4))
				}},
				{"HandleBatch, filter", func(ctx context.Context, hs handlers) {
					_ = hs.filter.Run(ctx, items, func(context.Context, int) error { return nil })
				}},
				{"DoTx", func(ctx context.Context, hs handlers) {
					_, _ = DoTx(ctx, hs.h, "k6", Transactor[*fakeTx](db), func(context.Context, *fakeTx) error { return nil })
				}},
				{"HandleBatchTx", func(ctx context.Context, hs handlers) {
					_ = RunTx(ctx, hs.h, items, Transactor[*fakeTx](db), func(context.Context, *fakeTx, int) error { return nil })
				}},
				{"Lookup", func(ctx context.Context, hs handlers) { _, _ = hs.h.Lookup(ctx, "k1") }},
				{"Forget", func(ctx context.Context, hs handlers) { _, _ = hs.h.Forget(ctx, "k1") }},
				{"Health", func(ctx context.Context, hs handlers) {
					if rep := hs.d.Health(ctx); rep.Status != driver.HealthFail {
						t.Errorf("Health of a silent store: %v", rep.Status)
					}
				}},
			}
			const deadline = 300 * time.Millisecond
			var over []time.Duration
			for _, c := range calls {
				hs := fresh()
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				start := time.Now()
				c.call(ctx, hs)
				took := time.Since(start)
				cancel()
				if strings.HasSuffix(c.name, "Tx") { // its marker guards it: the store is not waited for
					if took > deadline/2 {
						t.Errorf("%s returned after %v: a transactional run waited for the store", c.name, took)
					}
				} else {
					over = append(over, took-deadline)
					if took < deadline-50*time.Millisecond || took > deadline+time.Second {
						t.Errorf("%s returned after %v, deadline %v", c.name, took, deadline)
					}
				}
				closing.Add(1)
				go func() {
					defer closing.Done()
					start := time.Now()
					hs.d.Close()
					if took := time.Since(start); took > 1500*time.Millisecond {
						t.Errorf("Close after %s took %v, want at most 1.5s", c.name, took)
					}
				}()
			}
			closing.Wait()
			sort.Slice(over, func(i, j int) bool { return over[i] < over[j] })
			if med := over[len(over)/2]; med > 100*time.Millisecond {
				t.Errorf("median overshoot of the deadline %v, want at most 100ms (all: %v)", med, over)
			}
			t.Logf("overshoot of the %v deadline: median %v, max %v", deadline, over[len(over)/2], over[len(over)-1])

			hs := fresh()
			h, d := hs.h, hs.d
			// a call without a deadline, still out at Close
			out := make(chan Result, 1)
			go func() {
				res, _ := h.Do(context.Background(), "k7", noop)
				out <- res
			}()
			time.Sleep(50 * time.Millisecond) // the claim is out
			start := time.Now()
			if err := d.Close(); err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); took > 1500*time.Millisecond {
				t.Errorf("Close took %v, want at most 1.5s", took)
			} else {
				t.Logf("Close took %v", took)
			}
			select {
			case res := <-out:
				if res.Outcome != Cancelled && res.Outcome != StoreUnavailable {
					t.Errorf("the call out at Close: %v", res.Outcome)
				}
			case <-time.After(time.Second):
				t.Error("the call out at Close did not return with it")
			}
		})
	}
}
