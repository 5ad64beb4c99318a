package dedup

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// A pipeline is not a transaction: Redis may run another client's commands between
// two of its commands (a 16 KiB read boundary, a retried send). These tests put them
// there with hooks on the pipeline that ClaimMany sends (SET NX PX GET, PTTL, GET per
// key).

// claimPipeline reports whether cmds is ClaimMany's first round trip.
func claimPipeline(cmds []redis.Cmder) bool {
	return len(cmds) >= 2 && cmds[0].Name() == "set" && cmds[1].Name() == "pttl"
}

// splitHook sends ClaimMany's SET alone, then runs between, then the rest.
type splitHook struct{ between func() }

func (splitHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (splitHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h splitHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !claimPipeline(cmds) {
			return next(ctx, cmds)
		}
		err := next(ctx, cmds[:1])
		h.between()
		if err2 := next(ctx, cmds[1:]); err == nil {
			err = err2
		}
		return err
	}
}

// afterHook runs after once ClaimMany's first round trip is back.
type afterHook struct{ after func() }

func (afterHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (afterHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h afterHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if claimPipeline(cmds) {
			h.after()
		}
		return err
	}
}

// hookedStores returns a store on a client with hook, and a plain one beside it (the
// other owner), on the real server, under a prefix of their own.
func hookedStores(t *testing.T, hook redis.Hook) (mine, other *redisstore.Store, prefix string) {
	t.Helper()
	prefix = testenv.Prefix()
	plain := testenv.Redis(t, prefix)
	opt := *plain.Options()
	hooked := redis.NewClient(&opt)
	hooked.AddHook(hook)
	t.Cleanup(func() { hooked.Close() })
	var err error
	// the pipeline these tests split: a cluster's ClaimMany
	if mine, err = redisstore.New(hooked, redisstore.WithoutBatchScripts()); err != nil {
		t.Fatal(err)
	}
	if other, err = redisstore.New(plain); err != nil {
		t.Fatal(err)
	}
	return mine, other, prefix
}

// Another owner completes its claim between the SET and the PTTL: the PTTL is the
// DONE record's retention, which must not become the InProgress answer's wait (the
// NATS adapter Naks with it).
func TestClaimManyInProgressTTLStaysWithinTheLease(t *testing.T) {
	ctx := context.Background()
	var other *redisstore.Store
	var key string
	mine, other, prefix := hookedStores(t, splitHook{between: func() {
		if err := complete1(ctx, other, key, "X", 24*time.Hour); err != nil {
			t.Error(err)
		}
	}})
	key = prefix + ":h:k"
	if a, err := claim1(ctx, other, key, "X", "", 30*time.Second); err != nil || a.Status != driver.StatusAcquired {
		t.Fatal(a, err)
	}
	got, err := mine.Claim(ctx, []driver.Entry{{Key: key, Token: "A", TTL: 30 * time.Second}, {Key: key + "-2", Token: "A", TTL: 30 * time.Second}}) // two: the batch path
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Err != nil || got[0].Status != driver.StatusInProgress || got[0].TTL > 30*time.Second {
		t.Fatalf("got %+v: want InProgress for at most the 30s lease", got[0])
	}
}

// The DONE record ends between the SET and the PTTL and another owner claims the
// key: its lease must not be taken for the DONE record's life. Cached, the key would
// answer Duplicate from the local tier after that owner fails and releases it, and
// the message would never run.
func TestClaimManyDuplicateOfAnEndedRecordIsNotCached(t *testing.T) {
	ctx := context.Background()
	var other *redisstore.Store
	var rk string
	mine, other, prefix := hookedStores(t, splitHook{between: func() {
		time.Sleep(60 * time.Millisecond) // the DONE record (50ms) ends
		if a, err := claim1(ctx, other, rk, "X", "", 30*time.Second); err != nil || a.Status != driver.StatusAcquired {
			t.Error(a, err)
		}
	}})
	d, err := New(mine, WithPrefix(prefix), WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	h, err := d.Register("h", WithMode(ModeDo))
	if err != nil {
		t.Fatal(err)
	}
	rk = h.RecordKey("m1")
	if a, err := mark1(ctx, other, rk, "Y", "", 50*time.Millisecond); err != nil || a.Status != driver.StatusAcquired {
		t.Fatal(a, err)
	}
	res := h.Run(ctx, []Item{{Key: "m1"}, {Key: "m1-2"}}, func(context.Context, int) error { return nil }) // two: the batch path
	if res[0].Outcome != Duplicate {
		t.Fatalf("batch: %v, want Duplicate (DONE when the SET saw it)", res[0].Outcome)
	}
	if err := release1(ctx, other, rk, "X"); err != nil { // the other owner's fn failed
		t.Fatal(err)
	}
	ran := false
	r, err := h.Do(ctx, "m1", func(context.Context) error { ran = true; return nil })
	if !ran {
		t.Fatalf("after the other owner released the key: %v/%v %v, fn not run, though nothing is DONE", r.Outcome, r.Tier, err)
	}
}

// A retried claim finds its own claim, whose lease then runs out before the renewal
// and another owner claims the key: the answer is InProgress (docs/design.md §3), not a store
// failure, which a FailOpen handler would answer by running fn unguarded.
func TestClaimManyOwnClaimThatLapsedIsClaimedAgain(t *testing.T) {
	ctx := context.Background()
	var other *redisstore.Store
	var key string
	mine, other, prefix := hookedStores(t, afterHook{after: func() {
		time.Sleep(60 * time.Millisecond) // our 50ms lease ends
		if a, err := claim1(ctx, other, key, "X", "", 30*time.Second); err != nil || a.Status != driver.StatusAcquired {
			t.Error(a, err)
		}
	}})
	key = prefix + ":h:k"
	if a, err := claim1(ctx, mine, key, "A", "", 50*time.Millisecond); err != nil || a.Status != driver.StatusAcquired {
		t.Fatal(a, err)
	}
	got, err := mine.Claim(ctx, []driver.Entry{{Key: key, Token: "A", TTL: 50 * time.Millisecond}, {Key: key + "-2", Token: "A", TTL: 50 * time.Millisecond}}) // two: the batch path
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Err != nil || got[0].Status != driver.StatusInProgress || got[0].TTL <= 0 || got[0].TTL > 30*time.Second {
		t.Fatalf("got %+v, want InProgress with the other owner's lease", got[0])
	}
}
