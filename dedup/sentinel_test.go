package dedup

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/embedded"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// waitFor polls cond until it holds; the deadline only stops a hung test.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %s", what, state)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A Deduper works through a Sentinel-managed failover client (NewUniversalClient with
// MasterName), and its records survive a failover: after the replica is promoted,
// the same client finds the DONE record (Duplicate) and writes new ones on the new
// primary.
func TestRecordsSurviveASentinelFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const master = "dedupkit"
	primary := testenv.SpawnRedis(t)
	replica := testenv.SpawnRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port()))
	pc := redis.NewClient(&redis.Options{Addr: primary.Addr()})
	defer pc.Close()
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr()})
	defer rc.Close()
	waitFor(t, "replica linked", func() (bool, string) {
		s, err := testenv.ReadInfoField(ctx, rc, "replication", "master_link_status")
		return err == nil && s == "up", fmt.Sprint(s, err)
	})
	sentinel := testenv.Spawn(t, func(dir string) (*embedded.Proc, error) {
		return embedded.StartRedisSentinel(dir, master, primary.Addr(), 1, time.Second)
	})
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinel.Addr()})
	defer sc.Close()
	waitFor(t, "sentinel knows the replica, linked and up", func() (bool, string) {
		rs, err := sc.Replicas(ctx, master).Result()
		if err != nil || len(rs) != 1 {
			return false, fmt.Sprint(rs, err)
		}
		r := rs[0]
		return r["flags"] == "slave" && r["master-link-status"] == "ok", fmt.Sprint(r)
	})

	// What the README shows.
	rdb := redis.NewUniversalClient(&redis.UniversalOptions{
		MasterName: master,
		Addrs:      []string{sentinel.Addr()},
	})
	defer rdb.Close()
	if _, ok := rdb.(*redis.Client); !ok {
		t.Fatalf("NewUniversalClient with MasterName made a %T, want a failover *redis.Client", rdb)
	}
	st, err := redisstore.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	prefix := testenv.Prefix()
	d, err := New(st, WithPrefix(prefix), WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	h, err := d.Register("orders", WithLocalCache(0, 0)) // every check goes to Redis
	if err != nil {
		t.Fatal(err)
	}
	res, err := h.Do(ctx, "k1", ok)
	want(t, res, err, Processed)
	if pc.Exists(ctx, h.RecordKey("k1")).Val() != 1 {
		t.Fatal("the record is not on the primary")
	}
	// The record reaches the replica before the failover (replication is
	// asynchronous: a write not yet replicated would be lost, see the README).
	if n, err := pc.Do(ctx, "wait", 1, 10000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT: %d replicas, %v", n, err)
	}

	// NOGOODSLAVE until the sentinel has had a fresh enough reply from the replica.
	waitFor(t, "the sentinel starts a failover", func() (bool, string) {
		err := sc.Failover(ctx, master).Err()
		if err != nil && !strings.HasPrefix(err.Error(), "NOGOODSLAVE") {
			t.Fatal(err)
		}
		return err == nil, fmt.Sprint(err)
	})
	waitFor(t, "the sentinel names the replica as primary", func() (bool, string) {
		addr, err := sc.GetMasterAddrByName(ctx, master).Result()
		got := strings.Join(addr, ":")
		return err == nil && got == replica.Addr(), got
	})
	waitFor(t, "the replica is primary", func() (bool, string) {
		r, err := testenv.ReadInfoField(ctx, rc, "replication", "role")
		return err == nil && r == "master", fmt.Sprint(r, err)
	})
	// The failover client follows the sentinel (+switch-master); until it has, a
	// write may reach the demoted primary and be refused.
	probe := prefix + ":probe"
	waitFor(t, "the client writes to the new primary", func() (bool, string) {
		err := rdb.Set(ctx, probe, "x", time.Minute).Err()
		return err == nil && rc.Exists(ctx, probe).Val() == 1, fmt.Sprint(err)
	})

	res, err = h.Do(ctx, "k1", ok)
	want(t, res, err, Duplicate)
	res, err = h.Do(ctx, "k2", ok)
	want(t, res, err, Processed)
	if rc.Exists(ctx, h.RecordKey("k2")).Val() != 1 {
		t.Fatal("the new record is not on the new primary")
	}
}
