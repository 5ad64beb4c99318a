package nats

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// Transactional handlers through the adapter (HandleTx, TxHandler, HandleBatchTx) on
// SQLite, PostgreSQL and MariaDB: each order's row is committed exactly once, with
// failures, panics and republished copies on the way.

// flaky fails the first delivery of some keys (error or panic), so that their
// transaction rolls back and the redelivery runs them again.
func flaky(m *Msg, i int) error {
	if m.NumDelivered() > 1 {
		return nil
	}
	switch {
	case i%7 == 0:
		return errors.New("first delivery fails")
	case i%11 == 0:
		panic("first delivery panics")
	}
	return nil
}

// publishOrders stores n orders, then, after the stream's duplicate window, copies of
// the first dups of them (the same Nats-Msg-Id, new messages). It returns the last
// sequence.
func publishOrders(t *testing.T, e *env, n, dups int) uint64 {
	t.Helper()
	var last uint64
	for i := range n {
		last = e.publish("new", fmt.Sprint("order-", i), "x").Sequence
	}
	time.Sleep(2 * dupWindow)
	for i := range dups {
		last = e.publish("new", fmt.Sprint("order-", i), "x").Sequence
	}
	return last
}

func orderIndex(m *Msg) int {
	var i int
	fmt.Sscanf(m.Header(jetstream.MsgIDHeader), "order-%d", &i)
	return i
}

// checkOnce fails unless every order 0..n-1 has exactly one committed row.
func checkOnce(t *testing.T, d *orderDB, n int) {
	t.Helper()
	all := d.all(t)
	for i := range n {
		if got := all[fmt.Sprint("order-", i)]; got != 1 {
			t.Errorf("%s: order-%d committed %d times, want once", d.name, i, got)
		}
	}
	if len(all) != n {
		t.Errorf("%s: %d keys committed, want %d", d.name, len(all), n)
	}
}

// txAckWait is the AckWait of the consumers whose acks and duplicates are counted
// exactly: well above any stall of a loaded machine, so that every redelivery is one
// the adapter asked for (a Nak after a failure or a panic). At testAckWait (progress
// every 200ms), progress signals held up for half a second (seen under load) let the
// server redeliver messages still running: their copies were acked as duplicates, and
// counted as such.
const txAckWait = 10 * time.Second

// eachOrderDB runs body on each server and each database, with a stream holding n
// orders and dups republished copies, a consumer, and an adapter over the memory
// store; body consumes and returns once the orders are settled (up to last).
func eachOrderDB(t *testing.T, n, dups int, body func(t *testing.T, e *env, d *orderDB, c jetstream.Consumer, j *JetStream, last uint64)) {
	eachServer(t, func(t *testing.T, e *env) {
		for _, d := range orderDBs(t) {
			t.Run(d.name, func(t *testing.T) {
				e := e.sub(t)
				e.newStream()
				last := publishOrders(t, e, n, dups)
				c := e.consumer("orders", func(cc *jetstream.ConsumerConfig) {
					cc.MaxDeliver = 10
					cc.AckWait = txAckWait
				})
				h := register(t, newDeduper(t, memStore(t)), "orders")
				j := newJS(t, h, c, WithBackoff(func(uint64) time.Duration { return 10 * time.Millisecond }))
				body(t, e, d, c, j, last)
				checkOnce(t, d, n)
			})
		}
	})
}

// billFlaky is the tests' transactional fn: the order's row, then flaky's failure.
func billFlaky(d *orderDB) TxFunc[*sql.Tx] {
	return func(ctx context.Context, m *Msg, tx *sql.Tx) error {
		if err := d.insert(ctx, tx, m.Header(jetstream.MsgIDHeader), os.Getpid()); err != nil {
			return err
		}
		return flaky(m, orderIndex(m))
	}
}

func TestTxHandlerCommitsEachOrderOnce(t *testing.T) {
	const n, dups = 40, 15
	eachOrderDB(t, n, dups, func(t *testing.T, e *env, d *orderDB, c jetstream.Consumer, j *JetStream, last uint64) {
		consume(t, c, TxHandler(context.Background(), j, d.tr, billFlaky(d)))
		e.settled(c, last)
		j.Wait()
		if s := j.Stats(); s.Count(ActAck) != n+dups {
			t.Errorf("%d acks, want %d (every order and copy)", s.Count(ActAck), n+dups)
		}
	})
}

// A Fetch batch runs in one transaction (HandleBatchTx): the failures of some items
// roll back to their savepoints, the others commit, and the redeliveries run the
// failed ones.
func TestFetchBatchInOneTransactionCommitsEachOrderOnce(t *testing.T) {
	eachOrderDB(t, 30, 10, func(t *testing.T, e *env, d *orderDB, c jetstream.Consumer, j *JetStream, last uint64) {
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				batch, err := c.Fetch(8, jetstream.FetchMaxWait(200*time.Millisecond))
				if err != nil {
					continue
				}
				if _, err := HandleBatchTx(context.Background(), j, batch, d.tr, billFlaky(d)); err != nil && !isFetchTimeout(err) {
					t.Errorf("batch: %v", err)
				}
			}
		}()
		e.settled(c, last)
		cancel()
		wg.Wait()
	})
}

// Redis down: a transactional handler claims nothing, so it keeps committing each
// order once on its markers alone, whatever its store-failure policy.
func TestTxStoreDownCommitsOnTheMarkers(t *testing.T) {
	const n, dups = 20, 8
	for _, policy := range []dedup.StoreFailurePolicy{dedup.DatabaseOnly, dedup.FailClosed} {
		name := map[dedup.StoreFailurePolicy]string{dedup.DatabaseOnly: "database-only", dedup.FailClosed: "fail-closed"}[policy]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := connect(t, embeddedNATS(t))
			rs := testenv.SpawnRedis(t)
			rdb := redis.NewClient(&redis.Options{Addr: rs.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond,
				ReadTimeout: 200 * time.Millisecond, ContextTimeoutEnabled: true})
			t.Cleanup(func() { rdb.Close() })
			store, err := redisstore.New(rdb)
			if err != nil {
				t.Fatal(err)
			}
			d := newOrderDB(t, "sqlite")
			e.newStream()
			c := e.consumer("orders", func(cc *jetstream.ConsumerConfig) {
				cc.MaxDeliver = -1
				cc.AckWait = txAckWait
			})
			h := register(t, newDeduper(t, store, dedup.WithPrefix(testenv.Prefix())), "orders", dedup.WithStoreFailure(policy))
			j := newJS(t, h, c, WithUnlimitedRedelivery(), WithStoreRetryDelay(50*time.Millisecond))
			rs.Kill()
			last := publishOrders(t, e, n, dups)
			consume(t, c, TxHandler(context.Background(), j, d.tr, func(ctx context.Context, m *Msg, tx *sql.Tx) error {
				return d.insert(ctx, tx, m.Header(jetstream.MsgIDHeader), os.Getpid())
			}))
			e.settled(c, last) // with Redis down all along
			checkOnce(t, d, n)
			// the copies: answered by the markers, or by the local tier the
			// committed runs filled
			if s := h.Stats(); s.DatabaseDuplicates+s.LocalDuplicates != dups || s.Count(dedup.Processed) != n || s.Count(dedup.StoreUnavailable) != 0 {
				t.Errorf("stats %+v: want %d processed, %d duplicates, no StoreUnavailable", s, n, dups)
			}
			// back up, so that go-redis's redial goroutine (a dial a second
			// while the server is down) ends before the leak check
			if err := rs.Start(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A COMMIT that never leaves the client: the transaction's connection is reset
// after the handler's insert, so the driver's write of the COMMIT fails with
// nothing written. An ordinary failure, not CommitUnknown: Failed, the claim
// released at once, so that the redelivery after the backoff (1 s) runs the order
// and commits it, long before the lease (30 s) would have let it.
func TestTxCommitNeverSentIsAFailureRetriedAtOnce(t *testing.T) {
	for _, dialect := range []string{"postgres", "mysql"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			var dsn, upstream string
			var wire testenv.Wire
			if dialect == "postgres" {
				dsn = testenv.PostgresURL(t)
				upstream, wire = testenv.PostgresHost(t, dsn), testenv.PostgresWire
			} else {
				dsn = testenv.MySQLDSN(t) + "?interpolateParams=true"
				upstream, wire = testenv.MySQLHost(t, dsn), testenv.MySQLWire
			}
			proxy, err := testenv.NewSQLProxy(wire, upstream)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { proxy.Close() })
			if dialect == "postgres" {
				dsn = testenv.WithPostgresHost(dsn, proxy.Addr())
			} else {
				dsn = testenv.WithMySQLHost(dsn, proxy.Addr())
			}
			d := newOrderDBAt(t, dialect, dsn)
			e := connect(t, embeddedNATS(t))
			e.newStream()
			last := e.publish("new", "order-0", "x").Sequence
			c := e.consumer("orders", func(cc *jetstream.ConsumerConfig) { cc.MaxDeliver = 10 })
			const lease = 30 * time.Second
			h := register(t, newDeduper(t, memStore(t)), "orders", dedup.WithLease(lease))
			j := newJS(t, h, c)
			var mu sync.Mutex
			var results []string
			var reset atomic.Bool
			start := time.Now()
			t.Cleanup(func() {
				if t.Failed() {
					mu.Lock()
					t.Logf("results: %v", results)
					mu.Unlock()
				}
			})
			consume(t, c, func(msg jetstream.Msg) {
				res, act := HandleTx(context.Background(), j, msg, d.tr, func(ctx context.Context, m *Msg, tx *sql.Tx) error {
					if err := d.insert(ctx, tx, m.Header(jetstream.MsgIDHeader), os.Getpid()); err != nil {
						return err
					}
					if !reset.Load() { // the insert was the last message through the proxy
						reset.Store(proxy.ResetLast())
					}
					return nil
				})
				mu.Lock()
				results = append(results, fmt.Sprint(res.Outcome, "/", res.Tier, "/", act))
				mu.Unlock()
			})
			e.settled(c, last)
			mu.Lock()
			defer mu.Unlock()
			t.Logf("results after %v: %v", time.Since(start).Round(time.Millisecond), results)
			if !reset.Load() || len(results) != 2 || results[0] != "failed/none/nak-with-delay" || results[1] != "processed/none/ack" {
				t.Fatalf("reset %v, results %v; want Failed (NakWithDelay), then Processed", reset.Load(), results)
			}
			if took := time.Since(start); took >= lease {
				t.Fatalf("settled after %v: the claim was held for its lease", took)
			}
			checkOnce(t, d, 1)
		})
	}
}

// A COMMIT whose connection is cut: answered CommitUnknown (NakWithDelay, the claim
// kept for its lease); then the redelivery's marker decides. Cut after the server
// committed: a Duplicate from the database. Cut before it: the order runs again.
// Either way it is committed exactly once, and nothing is lost.
func TestTxCommitUnknownIsSettledByTheMarkerOnce(t *testing.T) {
	for _, dialect := range []string{"postgres", "mysql"} {
		for _, fault := range []testenv.CommitFault{testenv.CutAfterCommit, testenv.CutBeforeCommit} {
			name := map[testenv.CommitFault]string{testenv.CutAfterCommit: "cut-after-commit", testenv.CutBeforeCommit: "cut-before-commit"}[fault]
			t.Run(dialect+"/"+name, func(t *testing.T) {
				t.Parallel()
				var dsn, upstream string
				var wire testenv.Wire
				if dialect == "postgres" {
					dsn = testenv.PostgresURL(t)
					upstream, wire = testenv.PostgresHost(t, dsn), testenv.PostgresWire
				} else {
					dsn = testenv.MySQLDSN(t) + "?interpolateParams=true"
					upstream, wire = testenv.MySQLHost(t, dsn), testenv.MySQLWire
				}
				proxy, err := testenv.NewSQLProxy(wire, upstream)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { proxy.Close() })
				if dialect == "postgres" {
					dsn = testenv.WithPostgresHost(dsn, proxy.Addr())
				} else {
					dsn = testenv.WithMySQLHost(dsn, proxy.Addr())
				}
				d := newOrderDBAt(t, dialect, dsn)
				e := connect(t, embeddedNATS(t))
				e.newStream()
				last := e.publish("new", "order-0", "x").Sequence
				c := e.consumer("orders", func(cc *jetstream.ConsumerConfig) { cc.MaxDeliver = 10 })
				const lease = time.Second
				h := register(t, newDeduper(t, memStore(t)), "orders", dedup.WithLease(lease))
				j := newJS(t, h, c)
				var mu sync.Mutex
				var results []string
				var calls handling // the callback records its result after its ack
				proxy.ArmCommit(fault)
				consume(t, c, calls.wrap(func(msg jetstream.Msg) {
					res, act := HandleTx(context.Background(), j, msg, d.tr, func(ctx context.Context, m *Msg, tx *sql.Tx) error {
						return d.insert(ctx, tx, m.Header(jetstream.MsgIDHeader), os.Getpid())
					})
					mu.Lock()
					results = append(results, fmt.Sprint(res.Outcome, "/", res.Tier, "/", act))
					mu.Unlock()
				}))
				e.settled(c, last)
				calls.wait()
				mu.Lock()
				defer mu.Unlock()
				t.Logf("results: %v", results)
				if proxy.Hits() != 1 || len(results) < 2 || results[0] != "commit-unknown/none/nak-with-delay" {
					t.Fatalf("%d faulted commits, results %v; want CommitUnknown (NakWithDelay) first", proxy.Hits(), results)
				}
				want := "processed/none/ack"
				if fault == testenv.CutAfterCommit {
					want = "duplicate/database/ack"
				}
				if results[len(results)-1] != want {
					t.Errorf("last result %s, want %s", results[len(results)-1], want)
				}
				checkOnce(t, d, 1)
			})
		}
	}
}
