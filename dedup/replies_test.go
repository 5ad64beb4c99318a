package dedup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/memstore"
)

// replyBackends are the stores the stored-reply tests run on: both kinds of store,
// Redis on its two paths (go-redis, a Cluster).
func replyBackends() []backendFactory {
	var out []backendFactory
	for _, bf := range storeBackends() {
		switch bf.name {
		case "memory", "miniredis", "redis-server", "redis-cluster", "redis-server-direct":
			out = append(out, bf)
		}
	}
	return out
}

// binaryReply holds every byte value, the record's separators and CRLF: a reply is
// opaque bytes, and comes back as such.
var binaryReply = func() string {
	var b strings.Builder
	for i := range 256 {
		b.WriteByte(byte(i))
	}
	return "r:tok:3:fp\r\n" + b.String() + "\x00:"
}()

// The first run's reply is stored with DONE and comes back to every duplicate, byte
// for byte: from the local tier, from the store (another Deduper: another process),
// and in a batch; fn runs once.
func TestEveryDuplicateGetsTheStoredReply(t *testing.T) {
	for _, bf := range replyBackends() {
		t.Run(bf.name, func(t *testing.T) {
			t.Parallel()
			b := bf.new(t)
			ctx := context.Background()
			h := register(t, newDeduper(t, b.store, WithPrefix(b.prefix)), "orders", WithReplies(0))
			var runs atomic.Int32
			fn := func(context.Context) ([]byte, error) {
				runs.Add(1)
				return []byte(binaryReply), nil
			}
			res, err := runReply(h, ctx, "order-1", nil, fn)
			if err != nil || res.Outcome != Processed || !res.HasReply || res.Reply != binaryReply {
				t.Fatalf("first: %+v %v", res, err)
			}
			res, err = runReply(h, ctx, "order-1", nil, fn)
			if err != nil || res.Outcome != Duplicate || res.Tier != TierLocal || !res.HasReply || res.Reply != binaryReply {
				t.Fatalf("duplicate, local: %+v %v", res, err)
			}
			other := register(t, newDeduper(t, b.store, WithPrefix(b.prefix)), "orders", WithReplies(0))
			res, err = runReply(other, ctx, "order-1", nil, fn)
			if err != nil || res.Outcome != Duplicate || res.Tier != TierStore || !res.HasReply || res.Reply != binaryReply {
				t.Fatalf("duplicate, store: %+v %v", res, err)
			}
			res, _ = runReply(other, ctx, "order-1", nil, fn) // the store's answer was kept locally
			if res.Tier != TierLocal || res.Reply != binaryReply {
				t.Fatalf("duplicate, local after the store: %+v", res)
			}
			rs := other.Run(ctx, []Item{{Key: "order-1"}, {Key: "order-1"}}, replyingEach(func(context.Context, int) ([]byte, error) { return fn(ctx) }), Parallel(1))
			for i, r := range rs {
				if r.Err != nil || r.Outcome != Duplicate || r.Reply != binaryReply {
					t.Fatalf("batch item %d: %+v", i, r)
				}
			}
			if runs.Load() != 1 {
				t.Fatalf("fn ran %d times", runs.Load())
			}
			info, err := h.Lookup(ctx, "order-1")
			if err != nil || !info.HasReply || info.ReplySize != len(binaryReply) {
				t.Fatalf("lookup: %+v %v", info, err)
			}
			if s := h.Stats(); s.RepliesMissing != 0 || s.RepliesTooLarge != 0 {
				t.Fatalf("stats: %+v", s)
			}
		})
	}
}

// A reply larger than the limit: the message is processed (fn's reply in hand, for
// the first requester), DONE is written without the reply, the error says so and it
// is counted; its duplicates answer Duplicate with no reply, counted too.
func TestReplyTooLargeIsProcessedButNotStored(t *testing.T) {
	for _, bf := range replyBackends() {
		t.Run(bf.name, func(t *testing.T) {
			t.Parallel()
			b := bf.new(t)
			ctx := context.Background()
			h := register(t, newDeduper(t, b.store, WithPrefix(b.prefix)), "orders", WithReplies(8))
			big := []byte("123456789")
			res, err := runReply(h, ctx, "k", nil, func(context.Context) ([]byte, error) { return big, nil })
			if !errors.Is(err, ErrReplyTooLarge) || res.Outcome != Processed || !res.HasReply || res.Reply != string(big) {
				t.Fatalf("first: %+v %v", res, err)
			}
			ran := false
			for _, hh := range []*Handler{h, register(t, newDeduper(t, b.store, WithPrefix(b.prefix)), "orders", WithReplies(8))} {
				res, err = runReply(hh, ctx, "k", nil, func(context.Context) ([]byte, error) { ran = true; return nil, nil })
				if err != nil || res.Outcome != Duplicate || res.HasReply || res.Reply != "" {
					t.Fatalf("duplicate: %+v %v", res, err)
				}
				if s := hh.Stats(); s.RepliesMissing != 1 {
					t.Fatalf("missing replies counted %d", s.RepliesMissing)
				}
			}
			if ran || h.Stats().RepliesTooLarge != 1 || h.Stats().Count(Processed) != 1 {
				t.Fatalf("ran again %v, stats %+v", ran, h.Stats())
			}
			if info, _ := h.Lookup(ctx, "k"); info.State != driver.RecordDone || info.HasReply {
				t.Fatalf("lookup: %+v", info)
			}
			// at the limit exactly: stored
			res, err = runReply(h, ctx, "k2", nil, func(context.Context) ([]byte, error) { return big[:8], nil })
			if err != nil || res.Outcome != Processed {
				t.Fatalf("at the limit: %+v %v", res, err)
			}
			if res, _ := runReply(h, ctx, "k2", nil, notRun(t)); res.Reply != "12345678" {
				t.Fatalf("at the limit, duplicate: %+v", res)
			}
		})
	}
}

// An empty reply is a reply; a record written without one (by a run whose fn set
// none, or by a Mark of a handler without replies) has none: a duplicate of it says
// so instead of answering an empty reply. A key the local tier knows DONE without its
// reply goes to the store for it. Do and Mark on a handler WithReplies are errors:
// only Run's results carry replies.
func TestEmptyReplyIsAReplyAndARecordWithoutOneHasNone(t *testing.T) {
	ctx := context.Background()
	mem, _ := memstore.New()
	d := newDeduper(t, mem)
	h := register(t, d, "orders", WithReplies(0))
	if _, err := runReply(h, ctx, "empty", nil, func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if res, _ := runReply(h, ctx, "empty", nil, notRun(t)); res.Outcome != Duplicate || !res.HasReply || res.Reply != "" {
		t.Fatalf("empty reply: %+v", res)
	}
	if r := h.Run(ctx, []Item{{Key: "plain"}}, func(context.Context, int) error { return nil }); r[0].Outcome != Processed || r[0].HasReply {
		t.Fatalf("a run that sets no reply: %+v", r[0])
	}
	plain := register(t, newDeduper(t, mem), "orders") // another process's handler, without replies
	if _, err := plain.Mark(ctx, "marked"); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"plain", "marked"} {
		before := h.Stats().StoreDuplicates
		res, _ := runReply(h, ctx, k, nil, notRun(t)) // no reply in the local tier: the store answers
		if res.Outcome != Duplicate || res.HasReply || h.Stats().StoreDuplicates != before+1 {
			t.Fatalf("%s: %+v, store duplicates %d → %d", k, res, before, h.Stats().StoreDuplicates)
		}
	}
	if _, err := h.Do(ctx, "empty", ok); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("Do on a handler WithReplies: %v, want ErrInvalidOption", err)
	}
	if _, err := h.Mark(ctx, "empty"); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("Mark on a handler WithReplies: %v, want ErrInvalidOption", err)
	}
}

// The local tier's replies are bounded by bytes: a reply evicted from it is answered
// by the store, with the right bytes; the ones kept, locally.
func TestLocalRepliesAreBoundedByBytes(t *testing.T) {
	ctx := context.Background()
	mem, _ := memstore.New()
	h := register(t, newDeduper(t, mem), "orders", WithReplies(0), WithLocalReplies(4<<10))
	reply := func(i int) string { return fmt.Sprintf("%04d", i) + strings.Repeat("r", 996) }
	const n = 40 // 40 KB of replies for a 4 KB budget
	for i := range n {
		if _, err := runReply(h, ctx, fmt.Sprint("k", i), nil, func(context.Context) ([]byte, error) { return []byte(reply(i)), nil }); err != nil {
			t.Fatal(err)
		}
	}
	if size := h.replies.Size(); size > 4<<10 {
		t.Fatalf("local replies hold %d bytes, past their budget", size)
	}
	local, store := 0, 0
	for i := n - 1; i >= 0; i-- { // the most recent first: each answer from the store evicts an older one
		res, _ := runReply(h, ctx, fmt.Sprint("k", i), nil, notRun(t))
		if res.Outcome != Duplicate || res.Reply != reply(i) {
			t.Fatalf("k%d: %v, reply %.8q", i, res.Outcome, res.Reply)
		}
		switch res.Tier {
		case TierLocal:
			local++
		case TierStore:
			store++
		}
	}
	if local == 0 || store == 0 || local > 4 {
		t.Fatalf("%d answered locally, %d by the store: want a few, at most 4 KB, locally", local, store)
	}
}

// Concurrent duplicates of one request in one process make one run; under
// WaitForRunning every copy waits for it and gets its reply, otherwise a copy that
// comes while it runs is InProgress (to be retried) and never answered with a
// Duplicate without its reply.
func TestConcurrentDuplicatesGetTheReplyOrInProgress(t *testing.T) {
	for _, wait := range []bool{true, false} {
		t.Run(fmt.Sprint("wait:", wait), func(t *testing.T) {
			ctx := context.Background()
			if wait {
				ctx = WaitForRunning(ctx)
			}
			mem, _ := memstore.New()
			h := register(t, newDeduper(t, mem), "orders", WithReplies(0))
			var runs atomic.Int32
			release := make(chan struct{})
			fn := func(context.Context) ([]byte, error) {
				runs.Add(1)
				<-release
				return []byte("the reply"), nil
			}
			const n = 16
			results := make([]ItemResult, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					results[i], _ = runReply(h, ctx, "k", nil, fn)
				}()
			}
			for runs.Load() == 0 {
				time.Sleep(time.Millisecond)
			}
			time.Sleep(20 * time.Millisecond) // the copies reach the flight
			close(release)
			wg.Wait()
			counts := map[Outcome]int{}
			for _, r := range results {
				counts[r.Outcome]++
				switch r.Outcome {
				case Processed, Duplicate:
					if !r.HasReply || r.Reply != "the reply" {
						t.Fatalf("%v without the reply: %+v", r.Outcome, r)
					}
				case InProgress:
					if wait || r.RetryAfter <= 0 {
						t.Fatalf("InProgress: %+v", r)
					}
				default:
					t.Fatalf("outcome %v", r.Outcome)
				}
			}
			if runs.Load() != 1 || counts[Processed] != 1 {
				t.Fatalf("fn ran %d times; outcomes %v", runs.Load(), counts)
			}
			if wait && counts[Duplicate] != n-1 {
				t.Fatalf("outcomes %v", counts)
			}
		})
	}
}

// fn's error releases the claim and stores nothing: the retry runs fn again, and its
// reply is the one stored.
func TestFailedRunStoresNoReplyAndItsRetrysIsStored(t *testing.T) {
	ctx := context.Background()
	mem, _ := memstore.New()
	h := register(t, newDeduper(t, mem), "orders", WithReplies(0))
	boom := errors.New("boom")
	res, err := runReply(h, ctx, "k", nil, func(context.Context) ([]byte, error) { return []byte("partial"), boom })
	if !errors.Is(err, boom) || res.Outcome != Failed || res.HasReply {
		t.Fatalf("failed run: %+v %v", res, err)
	}
	res, err = runReply(h, ctx, "k", nil, func(context.Context) ([]byte, error) { return []byte("second"), nil })
	if err != nil || res.Outcome != Processed || res.Reply != "second" {
		t.Fatalf("retry: %+v %v", res, err)
	}
	if res, _ := runReply(h, ctx, "k", nil, notRun(t)); res.Reply != "second" {
		t.Fatalf("duplicate: %+v", res)
	}
}

// The batch form: each item's reply is carried by its claim to its completion (the
// completions' CompleteMany) and stored; items repeated in the batch get the first's
// reply; a failed item's is not stored; a too-large one is processed and not
// stored; duplicates, from another process's store answers, get them back.
func TestABatchStoresEachItemsReply(t *testing.T) {
	for _, bf := range replyBackends() {
		t.Run(bf.name, func(t *testing.T) {
			t.Parallel()
			b := bf.new(t)
			ctx := context.Background()
			h := register(t, newDeduper(t, b.store, WithPrefix(b.prefix)), "orders", WithReplies(16))
			items := []Item{{Key: "a"}, {Key: "b"}, {Key: "a"}, {Key: "fails"}, {Key: "large"}, {Key: "c"}}
			var runs atomic.Int32
			fn := func(_ context.Context, i int) ([]byte, error) {
				runs.Add(1)
				switch items[i].Key {
				case "fails":
					return []byte("no"), errors.New("boom")
				case "large":
					return []byte(strings.Repeat("L", 17)), nil
				}
				return []byte("reply of " + items[i].Key + "\x00"), nil
			}
			var doneCalls atomic.Int32
			for _, parallel := range []int{1, 4} {
				rs := h.Run(ctx, items, replyingEach(fn), Parallel(parallel), OnResult(func(int, ItemResult) { doneCalls.Add(1) }))
				if parallel > 1 {
					break
				}
				want := []struct {
					o     Outcome
					reply string
				}{{Processed, "reply of a\x00"}, {Processed, "reply of b\x00"}, {Duplicate, "reply of a\x00"},
					{Failed, ""}, {Processed, strings.Repeat("L", 17)}, {Processed, "reply of c\x00"}}
				for i, w := range want {
					r := rs[i]
					if r.Outcome != w.o || r.Reply != w.reply || r.HasReply != (w.reply != "") {
						t.Fatalf("item %d: %+v, want %v %q", i, r, w.o, w.reply)
					}
				}
				if !errors.Is(rs[4].Err, ErrReplyTooLarge) {
					t.Fatalf("large item: %v", rs[4].Err)
				}
			}
			if doneCalls.Load() != int32(2*len(items)) {
				t.Fatalf("done called %d times", doneCalls.Load())
			}
			// the second batch ran only "fails" again; its parallel run did too
			if runs.Load() != 5+1 {
				t.Fatalf("fn ran %d times", runs.Load())
			}
			other := register(t, newDeduper(t, b.store, WithPrefix(b.prefix)), "orders", WithReplies(16))
			rs := other.Run(ctx, []Item{{Key: "a"}, {Key: "b"}, {Key: "large"}, {Key: "c"}}, replyingEach(fn), Parallel(2))
			for i, w := range []string{"reply of a\x00", "reply of b\x00", "", "reply of c\x00"} {
				if r := rs[i]; r.Err != nil || r.Outcome != Duplicate || r.Tier != TierStore || r.Reply != w || r.HasReply != (w != "") {
					t.Fatalf("duplicate item %d: %+v", i, r)
				}
			}
			if res, _ := runReply(other, ctx, "c", nil, notRun(t)); res.Tier != TierLocal || res.Reply != "reply of c\x00" {
				t.Fatalf("single after batch: %+v", res)
			}
		})
	}
}

// The reply forms need WithReplies, and WithReplies a store that keeps replies.
func TestRepliesNeedWithRepliesAndAStoreThatKeepsThem(t *testing.T) {
	ctx := context.Background()
	mem, _ := memstore.New()
	d := newDeduper(t, mem)
	plain := register(t, d, "plain")
	if _, err := runReply(plain, ctx, "k", nil, notRun(t)); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("DoReply without WithReplies: %v", err)
	}
	for _, r := range plain.Run(ctx, []Item{{Key: "k"}}, replyingEach(func(context.Context, int) ([]byte, error) { return nil, nil }), Parallel(1)) {
		if !errors.Is(r.Err, ErrInvalidOption) {
			t.Fatalf("HandleBatchReply without WithReplies: %v", r.Err)
		}
	}
	for _, limit := range []int{-1, maxReplyLimit + 1} {
		if _, err := d.Register(fmt.Sprint("bad", limit+1), WithReplies(limit)); !errors.Is(err, ErrInvalidOption) {
			t.Fatalf("WithReplies(%d): %v", limit, err)
		}
	}
	if _, err := d.Register("neg", WithReplies(0), WithLocalReplies(-1)); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("WithLocalReplies(-1): %v", err)
	}
	// without a local tier, or with no local replies, every duplicate asks the store
	for _, opt := range []HandlerOption{WithLocalCache(0, 0), WithLocalReplies(0)} {
		h := register(t, d, fmt.Sprintf("nolocal%d", len(d.Handlers())), WithReplies(0), opt)
		_, _ = runReply(h, ctx, "k", nil, func(context.Context) ([]byte, error) { return []byte("x"), nil })
		if res, _ := runReply(h, ctx, "k", nil, notRun(t)); res.Tier != TierStore || res.Reply != "x" {
			t.Fatalf("%+v", res)
		}
	}
}

// Forget drops a key's reply from the local tier with the key: the message runs
// again, and its new reply is the one its duplicates get.
func TestForgetDropsLocalReply(t *testing.T) {
	ctx := context.Background()
	mem, _ := memstore.New()
	h := register(t, newDeduper(t, mem), "orders", WithReplies(0))
	for i, want := range []string{"one", "two"} {
		res, err := runReply(h, ctx, "k", nil, func(context.Context) ([]byte, error) { return []byte(want), nil })
		if err != nil || res.Outcome != Processed {
			t.Fatalf("run %d: %+v %v", i, res, err)
		}
		// (the local tier, or the store: the forget's own notice may come after the run)
		if res, _ := runReply(h, ctx, "k", nil, notRun(t)); res.Outcome != Duplicate || res.Reply != want {
			t.Fatalf("duplicate %d: %+v", i, res)
		}
		if _, err := h.Forget(ctx, "k"); err != nil {
			t.Fatal(err)
		}
	}
}

// A renamed handler answers a duplicate under its former name with the reply stored
// there, and copies the record forward with it.
func TestFormerNamesKeepReplies(t *testing.T) {
	ctx := context.Background()
	mem, _ := memstore.New()
	old := register(t, newDeduper(t, mem), "billing", WithReplies(0))
	if _, err := runReply(old, ctx, "k", nil, func(context.Context) ([]byte, error) { return []byte("invoice 7"), nil }); err != nil {
		t.Fatal(err)
	}
	renamed := register(t, newDeduper(t, mem), "invoices", WithReplies(0), WithFormerNames("billing"), WithLocalCache(0, 0))
	for range 2 { // under the former name, then under the copy forward
		if res, _ := runReply(renamed, ctx, "k", nil, notRun(t)); res.Outcome != Duplicate || res.Reply != "invoice 7" {
			t.Fatalf("%+v", res)
		}
	}
	if info, _ := renamed.Lookup(ctx, "k"); info.Handler != "invoices" || info.ReplySize != len("invoice 7") {
		t.Fatalf("copied forward: %+v", info)
	}
}

// notRun is a reply fn for calls that must be duplicates: it fails the test if run.
func notRun(t testing.TB) func(context.Context) ([]byte, error) {
	return func(context.Context) ([]byte, error) {
		t.Error("fn ran for a call that should be a duplicate")
		return nil, errors.New("not to be run")
	}
}

// SetReply after its run's fn has returned (from a goroutine fn left behind) is an
// error, not a race with the completion that stores the reply; a refused Run still
// hands every item's result to OnResult.
func TestSetReplyAfterFnReturnedIsRefused(t *testing.T) {
	ctx := context.Background()
	mem, _ := memstore.New()
	h := register(t, newDeduper(t, mem), "orders", WithReplies(0))
	late := make(chan error)
	returned := make(chan struct{})
	r := h.Run(ctx, []Item{{Key: "k"}}, func(ctx context.Context, _ int) error {
		go func() {
			<-returned
			late <- SetReply(ctx, []byte("late"))
		}()
		return SetReply(ctx, []byte("on time"))
	})[0]
	close(returned)
	if err := <-late; !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("SetReply after fn returned: %v, want ErrInvalidOption", err)
	}
	if r.Outcome != Processed || r.Reply != "on time" {
		t.Fatalf("run: %+v", r)
	}
	if dup, _ := runReply(h, ctx, "k", nil, notRun(t)); dup.Reply != "on time" {
		t.Fatalf("stored reply %q, want the one set before fn returned", dup.Reply)
	}

	var results int
	h.Run(ctx, []Item{{Key: "a"}, {Key: "b"}}, func(context.Context, int) error { return nil },
		Parallel(0), OnResult(func(int, ItemResult) { results++ }))
	if results != 2 {
		t.Fatalf("OnResult called %d times for a refused Run of 2 items", results)
	}
}
