package redisstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/internal/storekit"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// On a single server a Claim of several entries is a SET NX PX GET per entry, then,
// for the entries that found a record, the claim_many script; a Complete of several is
// the complete_many script; maxScriptKeys keys a call, the calls of a round trip in one pipeline. Each entry
// gets the answer a Claim or Complete of it alone would give in its place, in order:
// a key named twice sees its first claim, our own claim found again is renewed, a
// DONE record's reply and TTL come back, a record the store cannot read fails that
// entry alone, and a completion whose token is not the owner's changes nothing.
func TestBatchScriptsAnswerEachEntryAsTheSingleCall(t *testing.T) {
	for name, mk := range countedRedis(t) {
		t.Run(name, func(t *testing.T) {
			s, tc, prefix := mk(t)
			ctx := context.Background()
			key := func(i int) string { return fmt.Sprintf("%s:h:%d", prefix, i) }
			const n = 2*maxScriptKeys + 44 // three calls
			entries := make([]driver.Entry, n)
			for i := range entries {
				entries[i] = driver.Entry{Key: key(i), Token: "T", Fingerprint: "fp", TTL: time.Minute}
			}
			// load the scripts, so that the counts are the steady state's (two entries:
			// a batch of one takes the single calls' command and script)
			warm := []driver.Entry{{Key: key(-1), Token: "T", TTL: time.Minute}, {Key: key(-2), Token: "T", TTL: time.Minute}}
			for range 2 { // the second finds the first's claims: the claim_many script
				if _, err := s.Claim(ctx, warm); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.Complete(ctx, withReply(warm)); err != nil { // the complete_many script
				t.Fatal(err)
			}
			// what is there before: a DONE record with a reply, another's claim, our own
			// claim (a retried claim whose reply was lost), a key reused with another
			// payload, a record no dedup process writes
			if err := s.c.Set(ctx, key(1), storekit.EncodeReply("X", "fp", "the reply"), time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			if _, err := only(s.Claim(ctx, entry(key(2), "X", "", time.Minute))); err != nil {
				t.Fatal(err)
			}
			if _, err := only(s.Claim(ctx, entry(key(3), "T", "fp", time.Second))); err != nil {
				t.Fatal(err)
			}
			if _, err := only(s.Mark(ctx, entry(key(4), "X", "other", time.Hour))); err != nil {
				t.Fatal(err)
			}
			if err := s.c.Set(ctx, key(5), "garbage", time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			entries[200].Key = key(6) // named twice, in different calls
			tc.Reset()
			got, err := s.Claim(ctx, entries)
			if err != nil {
				t.Fatal(err)
			}
			// a SET NX PX GET per entry, then the six that found a record (keys 1 to 5,
			// and key 6 named again) in one claim_many script call
			testenv.ExpectTrips(t, "ClaimMany", tc, 2, n+1)
			check := func(i int, st driver.Status, ttlMin time.Duration) {
				t.Helper()
				if a := got[i]; a.Err != nil || a.Status != st || a.TTL < ttlMin || a.TTL > time.Hour {
					t.Errorf("entry %d: %+v, want %v with a TTL of at least %v", i, a, st, ttlMin)
				}
			}
			check(0, driver.StatusAcquired, 0)
			check(1, driver.StatusDuplicate, 59*time.Minute)
			if !got[1].HasReply || got[1].Reply != "the reply" {
				t.Errorf("entry 1: reply %q (%v), want the stored one", got[1].Reply, got[1].HasReply)
			}
			check(2, driver.StatusInProgress, 59*time.Second)
			check(3, driver.StatusAcquired, 0)
			if pttl := s.c.PTTL(ctx, key(3)).Val(); pttl < 59*time.Second {
				t.Errorf("our own claim found again: lease %v, want it renewed to a minute", pttl)
			}
			check(4, driver.StatusConflict, 0)
			if got[5].Err == nil || !errors.Is(got[5].Err, driver.ErrBadRecord) {
				t.Errorf("entry 5: %+v, want driver.ErrBadRecord for it alone", got[5])
			}
			check(6, driver.StatusAcquired, 0)
			check(200, driver.StatusAcquired, 0) // our own claim of entry 6: the same token
			for i := 7; i < n; i++ {
				if i != 200 {
					check(i, driver.StatusAcquired, 0)
				}
			}

			// complete every entry with a reply (the script, which checks the owners):
			// the other owner's claim and records are left alone
			entries[2].Token = "T"
			tc.Reset()
			errs, err := s.Complete(ctx, withReply(entries))
			if err != nil {
				t.Fatal(err)
			}
			testenv.ExpectTrips(t, "CompleteMany", tc, 1, 3)
			for i, e := range errs {
				want := error(nil)
				switch i {
				case 1, 2, 4, 5:
					want = driver.ErrLeaseLost
				}
				if !errors.Is(e, want) || (want == nil) != (e == nil) {
					t.Errorf("complete %d: %v, want %v", i, e, want)
				}
			}
			for i, want := range map[int]string{
				0: storekit.EncodeReply("T", "fp", "r"), 1: storekit.EncodeReply("X", "fp", "the reply"), 2: "p:X:", 3: storekit.EncodeReply("T", "fp", "r"),
				4: "d:X:other", 5: "garbage", n - 1: storekit.EncodeReply("T", "fp", "r"),
			} {
				if v := s.c.Get(ctx, key(i)).Val(); v != want {
					t.Errorf("key %d after CompleteMany: %q, want %q", i, v, want)
				}
			}
			// without replies: DONE whoever holds the key, a SET PX each
			completeWithoutReplies(t, s, tc, entries)
			for _, i := range []int{1, 2, 5, n - 1} {
				if v := s.c.Get(ctx, key(i)).Val(); v != "d:T:fp" {
					t.Errorf("key %d after CompleteMany without replies: %q, want DONE", i, v)
				}
			}
			// a completion with a reply, and one retried after it landed
			rk := key(n + 1)
			if a, err := only(s.Claim(ctx, entry(rk, "R", "", time.Minute))); err != nil || a.Status != driver.StatusAcquired {
				t.Fatal(a, err)
			}
			re := []driver.Entry{{Key: rk, Token: "R", TTL: time.Hour, Reply: "", HasReply: true}, {Key: rk, Token: "R", TTL: time.Hour, Reply: "x", HasReply: true}}
			if errs, err := s.Complete(ctx, re); err != nil || errs[0] != nil || errs[1] != nil {
				t.Fatal(errs, err)
			}
			if v := s.c.Get(ctx, rk).Val(); v != storekit.EncodeReply("R", "", "") {
				t.Errorf("reply record %q, want the first completion's empty reply", v)
			}
		})
	}
}

// WithoutBatchScripts sends the batch calls as on a cluster, a command or script per
// key (for a proxy that routes each command by its key), with the same answers.
func TestWithoutBatchScriptsCallsGoPerKeyWithTheSameAnswers(t *testing.T) {
	for name, mk := range countedRedis(t) {
		t.Run(name, func(t *testing.T) {
			s, tc, prefix := mk(t)
			if err := WithoutBatchScripts()(s); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			entries := []driver.Entry{{Key: prefix + ":h:a", Token: "T", TTL: time.Minute}, {Key: prefix + ":h:b", Token: "T", TTL: time.Minute}}
			if _, err := only(s.Mark(ctx, entry(entries[1].Key, "X", "", time.Minute))); err != nil {
				t.Fatal(err)
			}
			tc.Reset()
			got, err := s.Claim(ctx, entries)
			if err != nil || got[0].Status != driver.StatusAcquired || got[1].Status != driver.StatusDuplicate || got[1].TTL <= 0 {
				t.Fatalf("%+v %v", got, err)
			}
			if tc.Trips() != 1 || tc.Cmds() != 6 { // SET NX PX GET, PTTL and GET per key
				t.Fatalf("ClaimMany: %d round trips carrying %d commands (%s), want 1 carrying 6", tc.Trips(), tc.Cmds(), tc)
			}
			tc.Reset()
			errs, err := s.Complete(ctx, withReply(entries))
			if err != nil || errs[0] != nil || !errors.Is(errs[1], driver.ErrLeaseLost) {
				t.Fatal(errs, err)
			}
			if tc.Cmds() < 2 { // the complete script per key (and EVAL after NOSCRIPT)
				t.Fatalf("CompleteMany: %d commands (%s), want one per key", tc.Cmds(), tc)
			}
		})
	}
}

// proxyHook makes a client look like a sharding proxy: INFO is refused (twemproxy and
// Envoy do not implement it), or a script naming several keys is answered CROSSSLOT
// (a proxy in front of a cluster), without running it.
type proxyHook struct{ noInfo, crossSlot bool }

type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

func (proxyHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h proxyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.noInfo && cmd.Name() == "info" {
			cmd.SetErr(replyErr("ERR unsupported command"))
			return cmd.Err()
		}
		return next(ctx, cmd)
	}
}
func (h proxyHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var sent []redis.Cmder
		for _, c := range cmds {
			if a := c.Args(); h.crossSlot && (c.Name() == "evalsha" || c.Name() == "eval") && fmt.Sprint(a[2]) != "1" {
				c.SetErr(replyErr("CROSSSLOT Keys in request don't hash to the same slot"))
				continue
			}
			sent = append(sent, c)
		}
		if len(sent) == 0 {
			return nil
		}
		return next(ctx, sent)
	}
}

// Behind a sharding proxy the batch calls go per key, with the same answers: one
// that does not answer INFO is found by the probe; one that refuses a script over
// several slots (CROSSSLOT) turns the batch scripts off at the first refusal, and
// the refused calls go again per key.
func TestBatchScriptsTurnOffBehindAShardingProxy(t *testing.T) {
	for _, hook := range []proxyHook{{noInfo: true}, {crossSlot: true}} {
		t.Run(fmt.Sprintf("noInfo=%v", hook.noInfo), func(t *testing.T) {
			prefix := testenv.Prefix()
			plain := testenv.Redis(t, prefix)
			opt := *plain.Options()
			c := redis.NewClient(&opt)
			c.AddHook(hook)
			t.Cleanup(func() { c.Close() })
			s, err := New(c)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			entries := make([]driver.Entry, 3)
			for i := range entries {
				entries[i] = driver.Entry{Key: fmt.Sprintf("%s:h:%d", prefix, i), Token: "T", TTL: time.Minute}
			}
			// records there, so that the Claim needs its second round trip
			for i := range 2 {
				if _, err := only(s.Mark(ctx, entry(entries[i].Key, "X", "", time.Hour))); err != nil {
					t.Fatal(err)
				}
			}
			got, err := s.Claim(ctx, entries)
			if err != nil {
				t.Fatal(err)
			}
			for i, want := range []driver.Status{driver.StatusDuplicate, driver.StatusDuplicate, driver.StatusAcquired} {
				if got[i].Err != nil || got[i].Status != want {
					t.Fatalf("claim %d: %+v, want %v", i, got[i], want)
				}
			}
			if s.scripts.Load() != scriptsOff {
				t.Fatal("batch scripts still on behind the proxy")
			}
			errs, err := s.Complete(ctx, withReply(entries))
			if err != nil || !errors.Is(errs[0], driver.ErrLeaseLost) || !errors.Is(errs[1], driver.ErrLeaseLost) || errs[2] != nil {
				t.Fatal(errs, err)
			}
			if v := plain.Get(ctx, entries[2].Key).Val(); v != storekit.EncodeReply("T", "", "r") {
				t.Fatalf("record %q after CompleteMany, want DONE", v)
			}
		})
	}
}

// A key of another type in a complete_many call (completions with replies; one
// without is a SET, which replaces the key whatever its type) fails that completion
// alone: the
// others are completed and say so (GET's error aborted the script
// half-way, the keys before it DONE but reported failed, those after it left IN
// PROGRESS).
func TestCompleteManyKeyOfAnotherTypeFailsAlone(t *testing.T) {
	for name, mk := range countedRedis(t) {
		t.Run(name, func(t *testing.T) {
			s, _, prefix := mk(t)
			ctx := context.Background()
			entries := make([]driver.Entry, 4)
			for i := range entries {
				entries[i] = driver.Entry{Key: fmt.Sprintf("%s:h:%d", prefix, i), Token: "T", TTL: time.Minute}
				if i != 2 {
					if _, err := only(s.Claim(ctx, entry(entries[i].Key, "T", "", time.Minute))); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := s.c.RPush(ctx, entries[2].Key, "x").Err(); err != nil {
				t.Fatal(err)
			}
			if !s.batchScripts(ctx) {
				t.Fatal("batch scripts off on a Redis server")
			}
			errs, err := s.Complete(ctx, withReply(entries))
			if err != nil {
				t.Fatal(err)
			}
			for i, e := range errs {
				if (i == 2) != (e != nil) || (i == 2 && !errors.Is(e, driver.ErrStoreUnavailable)) {
					t.Fatalf("complete %d: %v", i, e)
				}
				if i != 2 {
					if v := s.c.Get(ctx, entries[i].Key).Val(); v != storekit.EncodeReply("T", "", "r") {
						t.Fatalf("key %d: %q, want DONE", i, v)
					}
				}
			}
		})
	}
}
