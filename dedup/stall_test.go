package dedup

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// TestStalledRepliesAreNeverFalseDuplicatesOrLost puts a TCP proxy (testenv.Proxy) between a go-redis client and a
// spawned redis-server, and in each of 100 trials stalls one command of the full
// engine mid-command: the command runs on the server, its reply is delayed past or
// within the client's ReadTimeout, or swallowed until the connection drops, or
// swallowed on every attempt go-redis makes. go-redis (ReadTimeout 100ms, its default
// 3 retries) retries on its own. The stalled command is the claim, the completion,
// the release after a failed fn, or a filter-mode Mark; in half the trials a rival
// delivery of the same message runs on a direct connection while the reply is held.
// Every delivery that is not acknowledged (InProgress, Failed, StoreUnavailable) is
// redelivered on the direct connection until one is, as a broker would.
//
// Over the 100 trials: no false duplicate (a message answered Duplicate although its fn
// never succeeded), no lost message (one that ends without its fn ever succeeding), no
// message processed twice, none stuck. The naive control, a plain SETNX through the
// same proxy and faults, answers "duplicate" for messages no one processed.
//
// It extends TestRetriedClaimAfterALostReplyIsOwn (one store call, a reply dropped inside
// the client's connection) to a real socket stall and to the engine's whole path.
func TestStalledRepliesAreNeverFalseDuplicatesOrLost(t *testing.T) {
	addr := spawnRedis(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	t.Run("engine", func(t *testing.T) {
		t.Parallel()
		testStalledEngine(t, addr, seed)
	})
	t.Run("naive-SETNX", func(t *testing.T) {
		t.Parallel()
		testStalledNaive(t, addr, seed)
	})
}

const (
	stallTrials      = 100
	stallWorkers     = 4 // trials run on this many proxies at once: most of a trial is waiting
	stallReadTimeout = 100 * time.Millisecond
	stallLease       = time.Second
	stallHandler     = "stall"
)

// stallTrial is one trial's plan.
type stallTrial struct {
	target string // the stalled command: "claim", "complete", "release" or "mark"
	kind   string // "delay", "swallow" or "exhaust" (every attempt swallowed)
	fault  testenv.Fault
	rival  bool
}

func (tr stallTrial) String() string {
	r := ""
	if tr.rival {
		r = "+rival"
	}
	return fmt.Sprintf("%s/%s(%d×%v)%s", tr.target, tr.kind, tr.fault.Replies, tr.fault.Hold.Round(time.Millisecond), r)
}

// stallPlan returns the trials: every target with every fault, with and without a
// rival, in turn; the durations are drawn from seed.
func stallPlan(seed uint64) []stallTrial {
	rng := rand.New(rand.NewPCG(seed, 0x57a11))
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo))) }
	const rt = stallReadTimeout
	targets := []string{"claim", "complete", "release", "mark"}
	kinds := []string{"delay", "swallow", "exhaust"}
	plan := make([]stallTrial, stallTrials)
	for i := range plan {
		tr := stallTrial{target: targets[i%4], rival: i/4%2 == 1, kind: kinds[i/8%3]}
		if tr.kind == "exhaust" && tr.target == "mark" {
			// A Mark whose every attempt is lost has written DONE under a token no
			// redelivery carries: filter mode's documented trade-off (README, Limits).
			tr.kind = "swallow"
		}
		switch tr.kind {
		case "delay": // within or past the ReadTimeout
			tr.fault = testenv.Fault{Kind: testenv.Delay, Replies: 1, Hold: between(rt/2, 3*rt)}
		case "swallow": // the connection drops before or after the ReadTimeout
			tr.fault = testenv.Fault{Kind: testenv.Swallow, Replies: 1, Hold: between(rt/4, 3*rt)}
		case "exhaust": // more replies than go-redis makes attempts
			tr.fault = testenv.Fault{Kind: testenv.Swallow, Replies: 4 + rng.IntN(3), Hold: between(rt/4, 2*rt)}
		}
		plan[i] = tr
	}
	return plan
}

// stallClient returns a client through a new proxy in front of addr: a short
// ReadTimeout, go-redis's default retries.
func stallClient(t *testing.T, addr string) (*testenv.Proxy, *redis.Client) {
	t.Helper()
	p, err := testenv.NewProxy(addr)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), ReadTimeout: stallReadTimeout})
	t.Cleanup(func() {
		c.Close()
		p.Close()
	})
	return p, c
}

// stallTally counts what the trials found.
type stallTally struct {
	mu                                   sync.Mutex
	falseDup, lost, double, stuck, dry   int
	first                                map[string]int // the stalled delivery's outcome
	redelivered, rivals, hits, processed int
	bad                                  []string
}

func (s *stallTally) add(tr stallTrial, r stallResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.first[r.first.String()]++
	s.redelivered += r.redeliveries
	s.hits += r.hits
	if tr.rival {
		s.rivals++
	}
	var what []string
	for _, c := range []struct {
		on   bool
		n    *int
		name string
	}{
		{r.falseDup, &s.falseDup, "false duplicate"},
		{r.lost, &s.lost, "lost"},
		{r.double, &s.double, "processed twice"},
		{r.stuck, &s.stuck, "stuck"},
		{r.hits == 0, &s.dry, "fault never hit"},
	} {
		if c.on {
			*c.n++
			what = append(what, c.name)
		}
	}
	if len(what) > 0 {
		s.bad = append(s.bad, fmt.Sprintf("trial %d %v: %s (deliveries: %s)", r.i, tr, strings.Join(what, ", "), strings.Join(r.log, ", ")))
	} else {
		s.processed++
	}
}

type stallResult struct {
	i                             int
	first                         Outcome
	hits, redeliveries            int
	falseDup, lost, double, stuck bool
	log                           []string
}

var errFailOnce = errors.New("stall: fn fails on the stalled delivery")

func testStalledEngine(t *testing.T, addr string, seed uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prefix := testenv.Prefix()
	direct := redis.NewClient(&redis.Options{Addr: addr})
	defer direct.Close()
	ds, err := redisstore.New(direct)
	if err != nil {
		t.Fatal(err)
	}
	dd, err := New(ds, WithPrefix(prefix), WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer dd.Close()
	hd, err := dd.Register(stallHandler, WithLease(stallLease))
	if err != nil {
		t.Fatal(err)
	}

	plan := stallPlan(seed)
	tally := &stallTally{first: map[string]int{}}
	var wg sync.WaitGroup
	for w := range stallWorkers {
		p, c := stallClient(t, addr)
		store, err := redisstore.New(c)
		if err != nil {
			t.Fatal(err)
		}
		stallWarm(ctx, t, store, fmt.Sprintf("%s:warm:%d", prefix, w))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(plan); i += stallWorkers {
				r := stallRun(ctx, t, p, store, hd, prefix, i, plan[i])
				tally.add(plan[i], r)
			}
		}()
	}
	wg.Wait()

	outcomes := make([]string, 0, len(tally.first))
	for o, n := range tally.first {
		outcomes = append(outcomes, fmt.Sprintf("%s %d", o, n))
	}
	sort.Strings(outcomes)
	t.Logf("%d trials (%d with a rival): %d false duplicates, %d lost, %d processed twice, %d stuck, %d without a hit; "+
		"%d replies faulted; stalled delivery ended %s; %d redeliveries",
		len(plan), tally.rivals, tally.falseDup, tally.lost, tally.double, tally.stuck, tally.dry,
		tally.hits, strings.Join(outcomes, ", "), tally.redelivered)
	for _, b := range tally.bad {
		t.Error(b)
	}
}

// stallWarm runs every store operation once through store, before any fault: the
// server has every script loaded (a NOSCRIPT reply would be faulted in place of the
// command's own) and the client has its connections open.
func stallWarm(ctx context.Context, t *testing.T, store driver.Store, key string) {
	t.Helper()
	steps := []func() error{
		func() error { _, err := claim1(ctx, store, key, "warm", "", time.Minute); return err },
		func() error { _, err := claim1(ctx, store, key, "warm", "", time.Minute); return err }, // found: own claim
		func() error { return extend1(ctx, store, key, "warm", time.Minute) },
		func() error { return complete1(ctx, store, key, "warm", time.Minute) },
		func() error { _, err := claim1(ctx, store, key, "other", "", time.Minute); return err }, // found: DONE
		func() error { return release1(ctx, store, key, "warm") },
		func() error { _, err := mark1(ctx, store, key+":m", "warm", "", time.Minute); return err },
	}
	for i, f := range steps {
		if err := f(); err != nil {
			t.Fatalf("warm-up step %d: %v", i, err)
		}
	}
}

// stallRun runs one trial on its own key: the stalled delivery through the proxy, a
// rival on the direct connection if planned, redeliveries until every copy is
// acknowledged, and a last redelivery that must find the message done.
func stallRun(ctx context.Context, t *testing.T, p *testenv.Proxy, store driver.Store, hd *Handler, prefix string, i int, tr stallTrial) stallResult {
	key := fmt.Sprintf("msg-%d", i)
	r := stallResult{i: i}
	var (
		mu      sync.Mutex
		success int // fn runs (or, for Mark, side effects) that succeeded
		sawDup  bool
	)
	fn := func(stalled bool) func(context.Context) error {
		return func(context.Context) error {
			if stalled && (tr.target == "complete" || tr.target == "release") {
				p.Arm(tr.fault) // the next command is the completion, or the release
			}
			if stalled && tr.target == "release" {
				return errFailOnce
			}
			mu.Lock()
			success++
			mu.Unlock()
			return nil
		}
	}
	// settle records a delivery's result and reports whether the broker would be done
	// with that copy (acknowledged or terminated).
	settle := func(who string, res Result) bool {
		mu.Lock()
		defer mu.Unlock()
		r.log = append(r.log, fmt.Sprintf("%s:%v", who, res.Outcome))
		switch res.Outcome {
		case First:
			success++ // the filter's side effect
			return true
		case Duplicate:
			sawDup = true
			if tr.target != "mark" && success == 0 {
				r.falseDup = true // Do answers Duplicate only once DONE is written
			}
			return true
		case Processed, NotRecorded, KeyReuse, NoKey:
			return true
		}
		return false
	}
	deliver := func(h *Handler, stalled bool) Result {
		var res Result
		if tr.target == "mark" {
			res, _ = h.Mark(ctx, key)
		} else {
			res, _ = h.Do(ctx, key, fn(stalled))
		}
		return res
	}

	dp, err := New(store, WithPrefix(prefix), WithLogger(quiet))
	if err != nil {
		t.Error(err)
		return r
	}
	hp, err := dp.Register(stallHandler, WithLease(stallLease), WithLocalCache(16, 0))
	if err != nil {
		t.Error(err)
		return r
	}
	hit := make(chan struct{})
	var once sync.Once
	tr.fault.OnHit = func(int) { once.Do(func() { close(hit) }) }
	stalledDone := make(chan struct{})
	rivalAcked := make(chan bool, 1)
	if tr.rival {
		go func() {
			select {
			case <-hit: // the stalled command has run on the server
			case <-stalledDone:
			}
			rivalAcked <- settle("rival", deliver(hd, false))
		}()
	}
	if tr.target == "claim" || tr.target == "mark" {
		p.Arm(tr.fault)
	}
	res := deliver(hp, true)
	r.hits = p.Disarm()
	close(stalledDone)
	dp.Close() // waits for a release sent in the background
	r.first = res.Outcome
	unacked := 0
	if !settle("stalled", res) {
		unacked++
	}
	if tr.rival && !<-rivalAcked {
		unacked++
	}
	for range unacked {
		deadline := time.Now().Add(5 * stallLease)
		for {
			r.redeliveries++
			res := deliver(hd, false)
			if settle("redelivery", res) {
				break
			}
			if time.Now().After(deadline) {
				r.stuck = true
				break
			}
			time.Sleep(min(max(res.RetryAfter, time.Millisecond), 20*time.Millisecond))
		}
	}
	mu.Lock()
	r.lost = success == 0 // every copy is settled, and fn never succeeded
	mu.Unlock()
	// One more redelivery after all that: the message is done, so it must not run
	// again (and if it was lost, a Duplicate here is a false one too).
	settle("after", deliver(hd, false))

	mu.Lock()
	defer mu.Unlock()
	r.falseDup = r.falseDup || (r.lost && sawDup)
	r.double = success > 1
	return r
}

// testStalledNaive is the control: SETNX through the same proxy and faults answers
// "already set" for keys no one else touched.
func testStalledNaive(t *testing.T, addr string, seed uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prefix := testenv.Prefix()
	rng := rand.New(rand.NewPCG(seed, 0x5e7))
	const rt = stallReadTimeout
	faults := make([]testenv.Fault, stallTrials)
	for i := range faults {
		if i%2 == 0 {
			faults[i] = testenv.Fault{Kind: testenv.Swallow, Replies: 1, Hold: rt/4 + time.Duration(rng.Int64N(int64(3*rt)))}
		} else { // a delay within the ReadTimeout would not fault a thing
			faults[i] = testenv.Fault{Kind: testenv.Delay, Replies: 1, Hold: rt*3/2 + time.Duration(rng.Int64N(int64(rt)))}
		}
	}
	var falseDup, failed, dry atomic.Int32
	var wg sync.WaitGroup
	for w := range stallWorkers {
		p, c := stallClient(t, addr)
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < stallTrials; i += stallWorkers {
				key := fmt.Sprintf("%s:naive:%d", prefix, i)
				p.Arm(faults[i])
				set, err := c.SetNX(ctx, key, "1", time.Minute).Result()
				if p.Disarm() == 0 {
					dry.Add(1)
				}
				switch {
				case err != nil:
					failed.Add(1)
				case !set:
					falseDup.Add(1) // no one else ever sets this key
				}
			}
		}()
	}
	wg.Wait()
	direct := redis.NewClient(&redis.Options{Addr: addr})
	defer direct.Close()
	testenv.DeletePrefix(t, direct, prefix)
	t.Logf("naive SETNX: %d/%d false duplicates, %d errors, %d trials without a hit", falseDup.Load(), stallTrials, failed.Load(), dry.Load())
	if dry.Load() != 0 {
		t.Errorf("%d trials without a hit: the control proved nothing", dry.Load())
	}
	if falseDup.Load() < stallTrials*9/10 {
		t.Errorf("naive SETNX: %d/%d false duplicates, want >= 90%%: the stall did not bite", falseDup.Load(), stallTrials)
	}
}
