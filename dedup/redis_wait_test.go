package dedup

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/storekit"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

func TestWithWaitReplicasRejectsBadSettings(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ReadTimeout: 2 * time.Second})
	defer c.Close()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cc.Close()
	for _, tc := range []struct {
		name    string
		client  redis.UniversalClient
		n       int
		timeout time.Duration
	}{
		{"no replicas", c, 0, time.Second},
		{"no timeout", c, 1, 0},
		{"timeout not below ReadTimeout", c, 1, 2 * time.Second},
		{"cluster client", cc, 1, time.Second},
	} {
		if _, err := redisstore.New(tc.client, redisstore.WithWaitReplicas(tc.n, tc.timeout)); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: err %v, want ErrInvalidOption", tc.name, err)
		}
	}
	if _, err := redisstore.New(c, redisstore.WithWaitReplicas(1, time.Second)); err != nil {
		t.Fatal(err)
	}
}

// A primary and a replica on loopback. With the replica up, a DONE record written
// with WithWaitReplicas(1, …) is on the replica when the write returns. With the
// replica stopped (SIGSTOP) or gone, Complete reports the shortfall within the WAIT
// timeout (Do answers NotRecorded), Mark keeps its answer and counts it.
func TestWaitReplicasPrimaryAndReplica(t *testing.T) {
	t.Parallel()
	primary := testenv.SpawnRedis(t, "--repl-diskless-sync-delay", "0")
	replica := testenv.SpawnRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port()))
	pc, rc := clientOf(t, primary), clientOf(t, replica)
	testenv.Eventually(t, 10*time.Second, "the replica to sync", func() bool {
		return testenv.InfoField(t, rc, "replication", "master_link_status") == "up" &&
			testenv.InfoField(t, pc, "replication", "connected_slaves") == "1"
	})

	const waitFor = 500 * time.Millisecond
	prefix := testenv.Prefix()
	open := func(wait time.Duration) (*redisstore.Store, *Deduper, *Handler) {
		in := instanceOn(t, pc, []redisstore.Option{redisstore.WithWaitReplicas(1, wait)}, prefix, "wait", WithLocalCache(0, 0), WithLease(5*time.Second))
		return in.d.Store().(*redisstore.Store), in.d, in.h
	}
	store, _, h := open(waitFor)
	ctx := context.Background()
	onReplica := func(key string) byte { // the record's state on the replica, 0 if none
		v, err := rc.Get(ctx, h.RecordKey(key)).Result()
		if errors.Is(err, redis.Nil) {
			return 0
		}
		if err != nil {
			t.Fatal(err)
		}
		r, _ := storekit.Parse(v)
		return r.State
	}
	// claims several keys directly on the store, for CompleteMany
	claimed := func(keys ...string) []driver.Entry {
		var es []driver.Entry
		for _, k := range keys {
			e := driver.Entry{Key: h.RecordKey(k), Token: newToken(), TTL: time.Hour}
			if a, err := claim1(ctx, store, e.Key, e.Token, "", 5*time.Second); err != nil || a.Status != driver.StatusAcquired {
				t.Fatalf("claim %s: %v %v", k, a.Status, err)
			}
			es = append(es, e)
		}
		return es
	}

	t.Run("replica up", func(t *testing.T) {
		// WAIT returns once the replica acknowledges, so a longer timeout costs nothing
		// here; a replica starved by the full -race run took over 500ms to acknowledge
		store, d, h := open(2 * time.Second) // below go-redis's 3s ReadTimeout
		runs := newTally()
		if res, err := h.Do(ctx, "up-1", runs.fn("up-1")); res.Outcome != Processed || err != nil {
			t.Fatalf("Do: %v %v", res.Outcome, err)
		}
		if res, err := h.Mark(ctx, "up-2"); res.Outcome != First || err != nil {
			t.Fatalf("Mark: %v %v", res.Outcome, err)
		}
		errs, err := store.Complete(ctx, claimed("up-3", "up-4"))
		if err != nil || errors.Join(errs...) != nil {
			t.Fatalf("CompleteMany: %v %v", err, errs)
		}
		// a completion with a reply (CompleteReply) waits as well, with its reply
		hr, err := d.Register("wait-replies", WithLocalCache(0, 0), WithLease(5*time.Second), WithReplies(0))
		if err != nil {
			t.Fatal(err)
		}
		if res, err := runReply(hr, ctx, "up-5", nil, func(context.Context) ([]byte, error) { return []byte("reply 5"), nil }); res.Outcome != Processed || err != nil {
			t.Fatalf("DoReply: %v %v", res.Outcome, err)
		}
		if v, _ := rc.Get(ctx, hr.RecordKey("up-5")).Result(); !strings.HasSuffix(v, "reply 5") || v[0] != storekit.StateReply {
			t.Errorf("up-5 on the replica: %q, want DONE with its reply as soon as the write returned", v)
		}
		// no polling: WAIT returned only once the replica had every write
		for _, k := range []string{"up-1", "up-2", "up-3", "up-4"} {
			if st := onReplica(k); st != storekit.StateDone {
				t.Errorf("%s on the replica: state %q, want DONE as soon as the write returned", k, st)
			}
		}
		if n := store.ReplicaShortfalls(); n != 0 {
			t.Fatalf("%d shortfalls with the replica up", n)
		}
	})

	// acknowledged waits until the primary knows the replica has everything written
	// so far (replicas report their offset every second).
	acknowledged := func(t *testing.T) {
		want, err := strconv.ParseInt(testenv.InfoField(t, pc, "replication", "master_repl_offset"), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 10*time.Second, "the replica's acknowledgement", func() bool {
			for _, kv := range strings.Split(testenv.InfoField(t, pc, "replication", "slave0"), ",") {
				if v, ok := strings.CutPrefix(kv, "offset="); ok {
					got, _ := strconv.ParseInt(v, 10, 64)
					return got >= want
				}
			}
			return false
		})
	}

	// short stops the replica and checks every DONE write reports the shortfall. The
	// claims for Complete and CompleteMany are made, and acknowledged by the replica,
	// before it stops: a WAIT sent on any connection but the one that wrote DONE
	// would find nothing unreplicated and answer 1 at once.
	short := func(t *testing.T, tag string, stop func() error) {
		t.Helper()
		single := claimed(tag + "-complete")[0]
		many := claimed(tag+"-many-1", tag+"-many-2")
		acknowledged(t)
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		before := store.ReplicaShortfalls()
		// Complete and CompleteMany first: no write since the stop has been sent yet
		if err := complete1(ctx, store, single.Key, single.Token, time.Hour); !errors.Is(err, redisstore.ErrNotReplicated) || !errors.Is(err, ErrStoreUnavailable) {
			t.Fatalf("Complete: %v; want ErrStoreUnavailable and ErrNotReplicated", err)
		}
		errs, err := store.Complete(ctx, many)
		if err != nil {
			t.Fatal(err)
		}
		for i, err := range errs {
			if !errors.Is(err, redisstore.ErrNotReplicated) {
				t.Fatalf("CompleteMany item %d: %v; want ErrNotReplicated", i, err)
			}
		}
		runs := newTally()
		key := tag + "-do"
		start := time.Now()
		res, err := h.Do(ctx, key, runs.fn(key))
		t.Logf("%s: Do answered %v after %v (WAIT timeout %v)", tag, res.Outcome, time.Since(start).Round(time.Millisecond), waitFor)
		if res.Outcome != NotRecorded || !errors.Is(err, ErrNotRecorded) || !errors.Is(err, redisstore.ErrNotReplicated) || !errors.Is(err, ErrStoreUnavailable) {
			t.Fatalf("Do: %v %v; want NotRecorded wrapping ErrNotReplicated", res.Outcome, err)
		}
		if runs.of(key) != 1 {
			t.Fatalf("fn ran %d times", runs.of(key))
		}
		// Mark keeps First (the handler must run, or the message is lost), counted
		if res, err := h.Mark(ctx, tag+"-mark"); res.Outcome != First || err != nil {
			t.Fatalf("Mark: %v %v; want First", res.Outcome, err)
		}
		if got := store.ReplicaShortfalls() - before; got != 5 {
			t.Fatalf("%d shortfalls counted, want 5 (Do, Complete, 2 CompleteMany, Mark)", got)
		}
		// the primary has them all DONE: the shortfall is about the replica only
		for _, k := range []string{key, tag + "-complete", tag + "-many-1", tag + "-mark"} {
			if v, _ := pc.Get(ctx, h.RecordKey(k)).Result(); v == "" || v[0] != storekit.StateDone {
				t.Fatalf("%s on the primary: %q, want DONE", k, v)
			}
		}
	}

	t.Run("replica paused", func(t *testing.T) {
		t.Cleanup(func() { _ = replica.Resume() }) // should the test stop half way
		short(t, "paused", replica.Pause)
		if err := replica.Resume(); err != nil {
			t.Fatal(err)
		}
		// once it has caught up, writes are acknowledged again
		testenv.Eventually(t, 10*time.Second, "the resumed replica to acknowledge", func() bool {
			e := claimed(fmt.Sprintf("resumed-%d", time.Now().UnixNano()))[0]
			return complete1(ctx, store, e.Key, e.Token, time.Hour) == nil
		})
	})

	t.Run("replica killed", func(t *testing.T) {
		short(t, "killed", func() error { replica.Kill(); return nil })
	})
}
