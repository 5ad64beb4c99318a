package dedup

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// A rolling upgrade to stored replies: processes of the version before them (their
// scripts are testdata/before-replies, as they were) run beside this one.
//
//   - A DONE record with a reply (r:...) is not misread by them: their claim script and
//     their forget script refuse it as a value dedup did not write (which their
//     handlers answer as a store failure: fail closed, the message redelivered, neither
//     run again nor dropped), and their complete script leaves it alone. Their Go
//     side parses a record as the Lua pattern '^([pd]):' does (FuzzRecord checks that
//     no record with a reply matches it), so their marks and batch claims refuse it
//     too.
//   - The records they write (d:..., p:...) are read by this version: a duplicate
//     without a reply.
func TestRecordsAreReadAcrossVersions(t *testing.T) {
	old := func(t *testing.T, name string) string {
		b, err := os.ReadFile("testdata/before-replies/" + name + ".lua")
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	run := func(t *testing.T, c redis.UniversalClient, prefix string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := redisstore.New(c)
		if err != nil {
			t.Fatal(err)
		}
		k := prefix + ":h:with-reply"
		if a, err := claim1(ctx, s, k, "new", "fp", time.Minute); err != nil || a.Status != driver.StatusAcquired {
			t.Fatalf("claim: %+v %v", a, err)
		}
		if err := completeReply1(ctx, s, k, "new", "the reply", time.Minute); err != nil {
			t.Fatal(err)
		}
		_, err = c.Eval(ctx, old(t, "claim"), []string{k}, "old", "fp", 30000).Result()
		if err == nil || !strings.Contains(err.Error(), ErrBadRecord.Error()) {
			t.Fatalf("the old claim script on a record with a reply: %v, want its 'unrecognised record'", err)
		}
		if n, err := c.Eval(ctx, old(t, "complete"), []string{k}, "old", 60000).Int(); err != nil || n != 0 {
			t.Fatalf("the old complete script: %v %v, want 0 (not its claim)", n, err)
		}
		_, err = c.Eval(ctx, old(t, "forget"), []string{k}, "1", prefix+":h", "with-reply").Result()
		if err == nil || !strings.Contains(err.Error(), ErrBadRecord.Error()) {
			t.Fatalf("the old forget script: %v, want its 'unrecognised record'", err)
		}
		if a, err := claim1(ctx, s, k, "new2", "fp", time.Minute); err != nil || !a.HasReply || a.Reply != "the reply" {
			t.Fatalf("after the old scripts: %+v %v", a, err)
		}

		// the old version's records, read by this one
		k = prefix + ":h:old"
		if err := c.Eval(ctx, old(t, "claim"), []string{k}, "old", "", 30000).Err(); err != nil {
			t.Fatal(err)
		}
		if a, err := claim1(ctx, s, k, "new", "", time.Minute); err != nil || a.Status != driver.StatusInProgress {
			t.Fatalf("an old claim: %+v %v", a, err)
		}
		if n, err := c.Eval(ctx, old(t, "complete"), []string{k}, "old", 60000).Int(); err != nil || n != 1 {
			t.Fatalf("old complete: %v %v", n, err)
		}
		if a, err := claim1(ctx, s, k, "new", "", time.Minute); err != nil || a.Status != driver.StatusDuplicate || a.HasReply || a.TTL <= 0 {
			t.Fatalf("an old DONE record: %+v %v", a, err)
		}
	}
	t.Run("miniredis", func(t *testing.T) {
		_, c := testenv.Miniredis(t)
		run(t, c, testenv.Prefix())
	})
	t.Run("redis-server", func(t *testing.T) {
		prefix := testenv.Prefix()
		run(t, testenv.Redis(t, prefix), prefix)
	})
}
