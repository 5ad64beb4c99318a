package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/internal/storekit"
	"github.com/dedupkit/dedupkit/keys"
)

// The model keeps, per key, every state the record may be in. On a fake clock that
// is one state. On the real server an expiry is known only to within the round trip
// that set it, so the model keeps the record both alive and expired and prunes what
// the server's answers rule out: no time margin decides a result.

// Outcomes of an Engine, as dedup names them.
const (
	processed  = "processed"
	first      = "first"
	duplicate  = "duplicate"
	inProgress = "in-progress"
	failed     = "failed"
)

const (
	modelTick  = 10 * time.Millisecond
	modelKeys  = 3
	modelEps   = 5 * time.Millisecond // real server: clock granularity and ms rounding
	fakeSeeds  = 20                   // seeds on a fake clock
	modelSteps = 400
	modelReal  = 2 // seeds on the real server
	realSteps  = 150
	engineRet  = 30 * modelTick // the engine handler's retention
)

// mRec is a record in the model. Its expiry is a window in model time: exact on a
// fake clock (lo == hi), the set op's round trip on the real server.
type mRec struct {
	state     byte
	token, fp string
	lo, hi    time.Duration
}

type errClass uint8

const (
	errNone errClass = iota
	errLeaseLost
	errInvalid
	errUnavailable
	errOther
)

var errClassNames = [...]string{"nil", "driver.ErrLeaseLost", "driver.ErrInvalidOption", "driver.ErrStoreUnavailable", "other"}

func (c errClass) String() string { return errClassNames[c] }

func classOf(err error) errClass {
	switch {
	case err == nil:
		return errNone
	case errors.Is(err, driver.ErrLeaseLost):
		return errLeaseLost
	case errors.Is(err, driver.ErrInvalidOption):
		return errInvalid
	case errors.Is(err, driver.ErrStoreUnavailable):
		return errUnavailable
	}
	return errOther
}

// mAns is an answer the model allows: a status, an error class and Answer.TTL's range.
type mAns struct {
	status       driver.Status
	err          errClass
	ttlLo, ttlHi time.Duration
}

func (a mAns) String() string {
	if a.err != errNone {
		return a.err.String()
	}
	if a.status == 0 {
		return "nil"
	}
	if a.ttlLo == a.ttlHi {
		return fmt.Sprintf("%v ttl=%v", a.status, a.ttlLo)
	}
	return fmt.Sprintf("%v ttl=%v..%v", a.status, a.ttlLo, a.ttlHi)
}

// got is what a store answered, in the model's terms.
type got struct {
	status driver.Status
	err    errClass
	ttl    time.Duration
}

func (g got) String() string {
	if g.err != errNone {
		return g.err.String()
	}
	if g.status == 0 {
		return "nil"
	}
	return fmt.Sprintf("%v ttl=%v", g.status, g.ttl)
}

func gotAnswer(a driver.Answer, err error) got {
	if err == nil {
		err = a.Err
	}
	if err != nil {
		return got{err: classOf(err)}
	}
	return got{status: a.Status, ttl: a.TTL}
}

// model is the reference: per key, every state the record may be in (nil: absent).
type model struct {
	eps  time.Duration
	recs map[string][]*mRec
}

func newModel(eps time.Duration) *model { return &model{eps: eps, recs: map[string][]*mRec{}} }

func (m *model) states(key string) []*mRec {
	if p, ok := m.recs[key]; ok {
		return p
	}
	return []*mRec{nil}
}

// live returns what p may be during an operation sent at s and answered at r.
func (m *model) live(p *mRec, s, r time.Duration) []*mRec {
	switch {
	case p == nil:
		return []*mRec{nil}
	case r+m.eps < p.lo:
		return []*mRec{p}
	case s-m.eps >= p.hi:
		return []*mRec{nil}
	}
	return []*mRec{p, nil}
}

// mOp is one step of a sequence.
type mOp struct {
	kind    string
	key     int
	token   string
	fp      string
	ttl     time.Duration
	entries []mOp // batch forms
}

func (o mOp) String() string {
	switch o.kind {
	case "advance":
		return "advance " + o.ttl.String()
	case "claimMany", "markMany", "completeMany", "extendMany", "releaseMany":
		parts := make([]string, len(o.entries))
		for i, e := range o.entries {
			parts[i] = e.String()
		}
		return o.kind + "[" + strings.Join(parts, "; ") + "]"
	case "do", "doFail", "doNested", "hmark":
		return fmt.Sprintf("engine %s k%d", o.kind, o.key)
	}
	return fmt.Sprintf("%s k%d tok=%q fp=%q ttl=%v", o.kind, o.key, o.token, o.fp, o.ttl)
}

func validToken(tok string) bool {
	return tok != "" && len(tok) <= storekit.MaxTokenLen && !strings.Contains(tok, ":")
}

// valid reports whether a store accepts o: tokens of 1..64 bytes without ':', TTLs ≥ 1ms.
func (o mOp) valid() bool {
	if !validToken(o.token) {
		return false
	}
	return o.kind == "release" || o.ttl >= time.Millisecond
}

func fpDiffer(stored, given string) bool { return stored != "" && given != "" && stored != given }

// apply is docs/design.md §3's table: op o on record cur (nil: absent, already expired by
// live), sent at s and answered at r. It returns the answer and the record after.
func apply(o mOp, cur *mRec, s, r time.Duration) (mAns, *mRec) {
	set := func(state byte, tok, fp string) *mRec {
		return &mRec{state: state, token: tok, fp: fp, lo: s + o.ttl, hi: r + o.ttl}
	}
	left := func() (time.Duration, time.Duration) { return cur.lo - r, cur.hi - s }
	mine := cur != nil && cur.token == o.token
	switch o.kind {
	case "claim":
		switch {
		case cur == nil:
			return mAns{status: driver.StatusAcquired}, set(storekit.StateInProgress, o.token, o.fp)
		case cur.state == storekit.StateInProgress && mine:
			return mAns{status: driver.StatusAcquired}, set(storekit.StateInProgress, o.token, cur.fp)
		case cur.state == storekit.StateInProgress:
			lo, hi := left()
			return mAns{status: driver.StatusInProgress, ttlLo: lo, ttlHi: hi}, cur
		case fpDiffer(cur.fp, o.fp):
			return mAns{status: driver.StatusConflict}, cur
		default:
			lo, hi := left()
			return mAns{status: driver.StatusDuplicate, ttlLo: lo, ttlHi: hi}, cur
		}
	case "complete": // without a reply: DONE whoever holds the key (driver.Store)
		return mAns{}, set(storekit.StateDone, o.token, o.fp)
	case "release":
		if mine && cur.state == storekit.StateInProgress {
			return mAns{}, nil
		}
		return mAns{}, cur
	case "extend":
		if mine && cur.state == storekit.StateInProgress {
			return mAns{}, set(storekit.StateInProgress, cur.token, cur.fp)
		}
		return mAns{err: errLeaseLost}, cur
	case "mark":
		switch {
		case cur == nil:
			return mAns{status: driver.StatusAcquired}, set(storekit.StateDone, o.token, o.fp)
		case cur.state == storekit.StateInProgress:
			return mAns{status: driver.StatusInProgress}, cur // Mark does not say the TTL
		case mine:
			return mAns{status: driver.StatusAcquired}, cur // my retried mark
		case fpDiffer(cur.fp, o.fp):
			return mAns{status: driver.StatusConflict}, cur
		default:
			return mAns{status: driver.StatusDuplicate}, cur
		}
	}
	panic("model: unknown op " + o.kind)
}

// step checks g, a store's answer to o sent at s and answered at r, and keeps the
// states that allow it. It returns the answers the model allowed when none matches.
func (m *model) step(key string, o mOp, g got, s, r time.Duration) (allowed []mAns, ok bool) {
	if !o.valid() {
		a := mAns{err: errInvalid}
		return []mAns{a}, g == got{err: errInvalid}
	}
	var next []*mRec
	for _, p := range m.states(key) {
		for _, cur := range m.live(p, s, r) {
			a, after := apply(o, cur, s, r)
			allowed = append(allowed, a)
			if a.matches(g, m.eps) {
				next = appendState(next, after)
			}
		}
	}
	if len(next) == 0 {
		return allowed, false
	}
	m.recs[key] = next
	return nil, true
}

func (a mAns) matches(g got, eps time.Duration) bool {
	if a.err != g.err {
		return false
	}
	if a.err != errNone {
		return true
	}
	return a.status == g.status && g.ttl >= a.ttlLo-eps && g.ttl <= a.ttlHi+eps
}

func appendState(states []*mRec, s *mRec) []*mRec {
	for _, x := range states {
		if (x == nil && s == nil) || (x != nil && s != nil && *x == *s) {
			return states
		}
	}
	return append(states, s)
}

// genOps returns a seeded random sequence; engine adds the engine's operations.
func genOps(seed uint64, n int, engine bool) []mOp {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	token := func() string {
		if rng.IntN(40) == 0 {
			return pick("", "a:b", strings.Repeat("x", storekit.MaxTokenLen+1))
		}
		return pick("t1", "t2", "t3")
	}
	ticks := func(xs ...int) time.Duration {
		if rng.IntN(50) == 0 {
			return pick2(rng, 0, 500*time.Microsecond)
		}
		return time.Duration(xs[rng.IntN(len(xs))]) * modelTick
	}
	lease := func() time.Duration { return ticks(3, 5, 8, 20) }
	retention := func() time.Duration { return ticks(10, 30, 60) }
	one := func(kind string) mOp {
		o := mOp{kind: kind, key: rng.IntN(modelKeys), token: token(), fp: pick("", "", "f1", "f2", "x:y")}
		switch kind {
		case "claim", "extend":
			o.ttl = lease()
		case "mark":
			o.ttl = retention()
		case "complete":
			o.ttl = retention()
			if engine && o.ttl >= time.Millisecond {
				// a completion writes DONE whoever holds the key; dedup's own of a key
				// carry its handler's retention, so never one shorter than the
				// engine's, which would end its DONE before its local tier's entry
				o.ttl = max(o.ttl, engineRet)
			}
		}
		return o
	}
	type weighted struct {
		kind string
		w    int
	}
	kinds := []weighted{{"claim", 25}, {"complete", 14}, {"release", 8}, {"extend", 10}, {"mark", 14},
		{"claimMany", 3}, {"markMany", 3}, {"completeMany", 3}, {"extendMany", 2}, {"releaseMany", 2}, {"advance", 16}}
	if engine {
		kinds = append(kinds, weighted{"do", 7}, weighted{"doFail", 3}, weighted{"doNested", 3}, weighted{"hmark", 7})
	}
	total := 0
	for _, k := range kinds {
		total += k.w
	}
	ops := make([]mOp, n)
	for i := range ops {
		x := rng.IntN(total)
		var kind string
		for _, k := range kinds {
			if x < k.w {
				kind = k.kind
				break
			}
			x -= k.w
		}
		switch kind {
		case "advance":
			ops[i] = mOp{kind: kind, ttl: time.Duration(pickInt(rng, 1, 2, 3, 5, 8, 13)) * modelTick}
		case "claimMany", "markMany", "completeMany", "extendMany", "releaseMany":
			o := mOp{kind: kind}
			for range 1 + rng.IntN(4) { // keys may repeat within a batch
				o.entries = append(o.entries, one(strings.TrimSuffix(kind, "Many")))
			}
			ops[i] = o
		case "do", "doFail", "doNested", "hmark":
			ops[i] = mOp{kind: kind, key: rng.IntN(modelKeys)}
		default:
			ops[i] = one(kind)
		}
	}
	return ops
}

func pick2(rng *rand.Rand, a, b time.Duration) time.Duration {
	if rng.IntN(2) == 0 {
		return a
	}
	return b
}

func pickInt(rng *rand.Rand, xs ...int) int { return xs[rng.IntN(len(xs))] }

func modelSeeds(n int) []uint64 {
	if v := os.Getenv("DEDUP_MODEL_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			panic("DEDUP_MODEL_SEED: " + err.Error())
		}
		return []uint64{s}
	}
	seeds := make([]uint64, n)
	seeds[0] = uint64(time.Now().UnixNano()) // a new one each run; the rest are fixed
	for i := 1; i < n; i++ {
		seeds[i] = uint64(i)
	}
	return seeds
}

// Engine is the engine's handler "model" over the store under test, under the
// Backend's Prefix, with the retention RunModel gives, a lease longer than the run and
// a local tier on the Backend's clock. RunModel drives it between store calls.
type Engine interface {
	Do(ctx context.Context, key string, fn func(context.Context) error) EngineResult
	Mark(ctx context.Context, key string) EngineResult
}

// EngineResult is what an Engine call answered.
type EngineResult struct {
	Outcome    string // as dedup.Outcome's String: "processed", "duplicate", ...
	Local      bool   // a duplicate answered by the local tier
	RetryAfter time.Duration
}

// ModelConfig sizes RunModel.
type ModelConfig struct {
	// Seeds is how many sequences run, each on a new Backend (default 20, 2 on real
	// time); DEDUP_MODEL_SEED=n runs the one seed n.
	Seeds int
	// Steps is the operations per sequence (default 400, 150 on real time).
	Steps int
	// Engine, when set, builds an Engine over each Backend with a fake clock (Now).
	Engine func(t *testing.T, b Backend, retention time.Duration) Engine
}

// RunModel runs seeded random sequences of store calls, time advances and (with
// cfg.Engine) engine calls against the store and a reference model of the table in
// docs/design.md §3: every answer must be one the model allows.
func RunModel(t *testing.T, newBackend func(t *testing.T) Backend, cfg ModelConfig) {
	t.Helper()
	probe := checked(t, newBackend(t))
	real := probe.Now == nil
	if cfg.Seeds == 0 {
		cfg.Seeds = map[bool]int{false: fakeSeeds, true: modelReal}[real]
	}
	if cfg.Steps == 0 {
		cfg.Steps = map[bool]int{false: modelSteps, true: realSteps}[real]
	}
	for i, seed := range modelSeeds(cfg.Seeds) {
		b := probe
		if i > 0 {
			b = checked(t, newBackend(t))
		}
		runModel(t, b, seed, cfg)
		if t.Failed() {
			return
		}
	}
}

// run is one sequence on one backend.
type run struct {
	t       *testing.T
	b       Backend
	now     func() time.Duration // model time
	h       Engine
	m       *model
	seed    uint64
	keys    []string // record keys, as the engine handler builds them
	raw     []string // the message keys
	history []string
	engine  struct{ local, store, processed, first int }
}

func runModel(t *testing.T, b Backend, seed uint64, cfg ModelConfig) {
	t.Helper()
	eps := time.Duration(0)
	var now func() time.Duration
	if b.Now == nil { // real time: expiries known to within a round trip
		eps = modelEps
		start := time.Now()
		now = func() time.Duration { return time.Since(start) }
	} else {
		start := b.Now()
		now = func() time.Duration { return b.Now().Sub(start) }
	}
	engine := cfg.Engine != nil && b.Now != nil
	r := &run{t: t, b: b, m: newModel(eps), seed: seed, now: now}
	for i := range modelKeys {
		r.raw = append(r.raw, fmt.Sprintf("k%d", i))
		r.keys = append(r.keys, keys.RecordKey(b.Prefix, "model", r.raw[i]))
	}
	if engine {
		r.h = cfg.Engine(t, b, engineRet)
	}
	for i, o := range genOps(seed, cfg.Steps, engine) {
		if !r.do(i, o) {
			return
		}
	}
	if engine {
		t.Logf("seed %d: engine answered %d duplicates from the local tier, %d from the store, %d processed, %d first",
			seed, r.engine.local, r.engine.store, r.engine.processed, r.engine.first)
	}
}

func (r *run) fail(step int, o mOp, format string, args ...any) bool {
	r.t.Helper()
	from := max(0, len(r.history)-25)
	r.t.Errorf("seed %d (DEDUP_MODEL_SEED=%d to rerun), step %d: %s: %s\nlast steps:\n  %s",
		r.seed, r.seed, step, o, fmt.Sprintf(format, args...), strings.Join(r.history[from:], "\n  "))
	return false
}

func (r *run) do(i int, o mOp) bool {
	r.t.Helper()
	s := r.now()
	switch o.kind {
	case "advance":
		r.b.Advance(o.ttl)
		r.history = append(r.history, fmt.Sprintf("%d %s", i, o))
		return true
	case "claim", "mark", "complete", "release", "extend":
		return r.batch(i, o, o.kind, []mOp{o}, s)
	case "claimMany", "markMany", "completeMany", "extendMany", "releaseMany":
		return r.batch(i, o, strings.TrimSuffix(o.kind, "Many"), o.entries, s)
	}
	return r.engineOp(i, o)
}

// batch runs o, a store call kind ("claim", ...), with ops as its entries.
func (r *run) batch(i int, o mOp, kind string, ops []mOp, s time.Duration) bool {
	r.t.Helper()
	ctx := context.Background()
	st := r.b.Store
	entries := make([]driver.Entry, len(ops))
	valid := true
	for j, e := range ops {
		entries[j] = driver.Entry{Key: r.keys[e.key], Token: e.token, Fingerprint: e.fp, TTL: e.ttl}
		valid = valid && e.valid()
	}
	var gots []got
	var err error
	switch kind {
	case "claim", "mark":
		var as []driver.Answer
		if kind == "claim" {
			as, err = st.Claim(ctx, entries)
		} else {
			as, err = st.Mark(ctx, entries)
		}
		for _, a := range as {
			gots = append(gots, gotAnswer(a, nil))
		}
	default:
		var errs []error
		switch kind {
		case "complete":
			errs, err = st.Complete(ctx, entries)
		case "extend":
			errs, err = st.Extend(ctx, entries)
		case "release":
			errs, err = st.Release(ctx, entries)
		default:
			panic("model: unknown op " + kind)
		}
		for _, e := range errs {
			gots = append(gots, got{err: classOf(e)})
		}
	}
	e := r.now()
	if len(ops) == 1 && o.entries == nil && err == nil && len(gots) == 1 {
		r.history = append(r.history, fmt.Sprintf("%d %s -> %s", i, o, gots[0]))
	} else {
		r.history = append(r.history, fmt.Sprintf("%d %s -> %v %v", i, o, gots, err))
	}
	if !valid { // one bad entry refuses the whole batch, and nothing is written
		if classOf(err) != errInvalid || gots != nil {
			return r.fail(i, o, "answered %v, %v; want driver.ErrInvalidOption for the whole batch", gots, err)
		}
		return true
	}
	if err != nil || len(gots) != len(entries) {
		return r.fail(i, o, "answered %d answers, %v; want %d answers", len(gots), err, len(entries))
	}
	for j, en := range ops {
		if allowed, ok := r.m.step(r.keys[en.key], en, gots[j], s, e); !ok {
			which := fmt.Sprintf("entry %d: ", j)
			if o.entries == nil {
				which = ""
			}
			return r.fail(i, o, "%sstore answered %s, the model allows %v (states %s)", which, gots[j], allowed, r.describe(en.key))
		}
	}
	return true
}

// engineOp runs the engine on a fake clock, where the model holds one state per key.
func (r *run) engineOp(i int, o mOp) bool {
	r.t.Helper()
	ctx := context.Background()
	key := r.keys[o.key]
	now := r.now()
	states := r.m.states(key)
	if len(states) != 1 {
		return r.fail(i, o, "engine ops need an exact clock, the model holds %d states", len(states))
	}
	cur := r.m.live(states[0], now, now)[0]
	written := func() { // DONE under a token of the engine's own, for the retention
		r.m.recs[key] = []*mRec{{state: storekit.StateDone, token: "~engine", lo: now + engineRet, hi: now + engineRet}}
	}

	var res EngineResult
	var nested []EngineResult
	ran := 0
	if o.kind == "hmark" {
		res = r.h.Mark(ctx, r.raw[o.key])
	} else {
		res = r.h.Do(ctx, r.raw[o.key], func(ctx context.Context) error {
			ran++
			if o.kind == "doNested" { // the key is IN PROGRESS now: neither may say Duplicate
				a := r.h.Do(ctx, r.raw[o.key], func(context.Context) error { ran++; return nil })
				b := r.h.Mark(ctx, r.raw[o.key])
				nested = append(nested, a, b)
			}
			if o.kind == "doFail" {
				return errors.New("model: fn failed")
			}
			return nil
		})
	}
	r.history = append(r.history, fmt.Sprintf("%d %s -> %v local=%v ran=%d nested=%v", i, o, res.Outcome, res.Local, ran, nested))

	if res.Outcome == duplicate && res.Local {
		r.engine.local++
		if cur == nil || cur.state != storekit.StateDone {
			return r.fail(i, o, "the local tier answered Duplicate for a record that is %s", describeRec(cur))
		}
		return ran == 0 || r.fail(i, o, "fn ran on a Duplicate")
	}
	for _, n := range nested {
		if n.Outcome != inProgress {
			return r.fail(i, o, "Do/Mark inside fn for its own IN PROGRESS key answered %v (local %v), want in-progress", n.Outcome, n.Local)
		}
	}
	var want string
	var retryAfter time.Duration
	switch {
	case cur == nil && o.kind == "hmark":
		want = first
		written()
		r.engine.first++
	case cur == nil && o.kind == "doFail":
		want = failed // released: the record stays absent
	case cur == nil:
		want = processed
		written()
		r.engine.processed++
	case cur.state == storekit.StateInProgress && o.kind == "hmark":
		want = duplicate // a filter drops it; only the local tier must not keep it
	case cur.state == storekit.StateInProgress:
		want, retryAfter = inProgress, cur.lo-now
	default:
		want = duplicate
	}
	if want == duplicate {
		r.engine.store++
	}
	if res.Outcome != want || res.RetryAfter != retryAfter {
		return r.fail(i, o, "engine answered %v (local %v) retry %v, want %v retry %v (record %s)",
			res.Outcome, res.Local, res.RetryAfter, want, retryAfter, describeRec(cur))
	}
	if wantRan := map[string]int{processed: 1, failed: 1}[want]; ran != wantRan {
		return r.fail(i, o, "fn ran %d times, want %d", ran, wantRan)
	}
	return true
}

func describeRec(p *mRec) string {
	if p == nil {
		return "absent"
	}
	state := map[byte]string{storekit.StateInProgress: "IN PROGRESS", storekit.StateDone: "DONE"}[p.state]
	if p.lo == p.hi {
		return fmt.Sprintf("%s tok=%q fp=%q exp=%v", state, p.token, p.fp, p.lo)
	}
	return fmt.Sprintf("%s tok=%q fp=%q exp=%v..%v", state, p.token, p.fp, p.lo, p.hi)
}

func (r *run) describe(k int) string {
	var parts []string
	for _, p := range r.m.states(r.keys[k]) {
		parts = append(parts, describeRec(p))
	}
	return fmt.Sprintf("at %v: %s", r.now(), strings.Join(parts, " | "))
}
