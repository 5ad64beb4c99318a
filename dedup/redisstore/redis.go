// Package redisstore is a dedup store on Redis 7 or later, through go-redis: a single
// server, a failover client, Redis Cluster or a Ring.
package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/internal/storekit"
)

var (
	//go:embed scripts/claim.lua
	claimLua    string
	claimScript = redis.NewScript(claimLua)
	//go:embed scripts/complete.lua
	completeLua    string
	completeScript = redis.NewScript(completeLua)
	//go:embed scripts/release.lua
	releaseLua    string
	releaseScript = redis.NewScript(releaseLua)
	//go:embed scripts/extend.lua
	extendLua    string
	extendScript = redis.NewScript(extendLua)
	//go:embed scripts/claim_many.lua
	claimManyLua    string
	claimManyScript = redis.NewScript(claimManyLua)
	//go:embed scripts/complete_many.lua
	completeManyLua    string
	completeManyScript = redis.NewScript(completeManyLua)
)

// Store is a dedup store on Redis: a driver.Store, RecordStore, HealthChecker and
// Pinger. A call of one entry names one key, so it runs on Redis Cluster; a call of
// several is one round trip, two for a Claim's or a Mark's keys that hold a record.
// docs/design.md §3 says what each call sends.
type Store struct {
	c    redis.UniversalClient
	wait *replicaWait // WithWaitReplicas; nil: DONE writes do not wait
	// scripts says how calls of several entries go; probedAt is when a probe failed
	// on the network, 0 once the answer is settled
	scripts  atomic.Int32
	probedAt atomic.Int64
	probing  atomic.Bool // one probe at a time; calls meanwhile go per key
	honours  bool        // the client has ContextTimeoutEnabled and read and write timeouts
	// found rises by one for each recent claim or mark that found a record and falls
	// by one for each that found the key free (a mark's WAIT path counts neither), within
	// [0, foundMax] (see findsRecords)
	found atomic.Int32
}

// foundMax bounds Store.found; at half of it claims go straight to the claim script,
// and marks to SET NX PX GET.
const foundMax = 8

// findsRecords reports whether recent claims and marks found records more often than
// free keys. They then go straight to the claim script, or to SET NX PX GET, one round
// trip where SET NX first costs two for a key that holds a record; otherwise SET NX
// first, and nothing more for a free key. Either way the answers are the same; only
// the cost differs.
func (s *Store) findsRecords() bool { return s.found.Load() >= foundMax/2 }

// sawClaims moves found by the claims that found a record less those that found the
// key free. It writes only to move: a run of free keys, or of records, writes nothing.
func (s *Store) sawClaims(found, free int) {
	for {
		n := s.found.Load()
		m := int32(min(max(int(n)+found-free, 0), foundMax))
		if m == n || s.found.CompareAndSwap(n, m) {
			return
		}
	}
}

// sawBatch is sawClaims for a batch's answers; failed entries count neither way.
func (s *Store) sawBatch(answers []driver.Answer) {
	var found, free int
	for _, a := range answers {
		switch {
		case a.Err != nil:
		case a.Status == driver.StatusAcquired:
			free++
		default:
			found++
		}
	}
	s.sawClaims(found, free)
}

// How a *redis.Client's batch calls go (Store.scripts).
const (
	scriptsUnknown int32 = iota
	scriptsOn
	scriptsOff
)

// reprobeAfter is how long calls go per key after a probe failed on the network.
const reprobeAfter = time.Minute

// WithoutBatchScripts sends a Claim or Complete of several entries per key, as on a
// cluster, through a *redis.Client too: for a proxy that answers INFO and routes each
// command by its key. Redis then spends more CPU per call (docs/operating.md).
func WithoutBatchScripts() Option {
	return func(s *Store) error {
		s.scripts.Store(scriptsOff)
		return nil
	}
}

// maxScriptKeys is the most keys one batch script call names: Redis runs a script to
// its end before any other command, so calls stay short.
const maxScriptKeys = 128

// batchScripts reports whether a Claim or Complete of several entries goes as batch
// scripts, whose keys span slots: only on a Redis server, never through a sharding
// proxy. The first call probes (probeScripts); until then calls go per key.
func (s *Store) batchScripts(ctx context.Context) bool {
	switch s.scripts.Load() {
	case scriptsOn:
		return true
	case scriptsOff:
		if at := s.probedAt.Load(); at == 0 || time.Now().UnixNano()-at < int64(reprobeAfter) {
			return false // settled, or probed on a failing network not long ago
		}
	}
	return s.probeScripts(ctx)
}

// probeScripts asks for INFO. A Redis server that is not a cluster node turns the
// batch scripts on; a cluster node or an error reply (twemproxy and Envoy lack INFO)
// turns them off for good; a network failure, for reprobeAfter.
func (s *Store) probeScripts(ctx context.Context) bool {
	if !s.probing.CompareAndSwap(false, true) {
		return false
	}
	defer s.probing.Store(false)
	cmd := redis.NewCmd(ctx, "info", "server")
	err := s.process(ctx, cmd)
	if err != nil && strings.Contains(err.Error(), "not supported") {
		// miniredis answers INFO without a section only
		cmd = redis.NewCmd(ctx, "info")
		err = s.process(ctx, cmd)
	}
	var info string
	if err == nil {
		info, err = cmd.Text()
	}
	var re redis.Error
	switch {
	case err == nil && !strings.Contains(info, "redis_mode:cluster"):
		s.scripts.Store(scriptsOn)
		return true
	case err == nil || errors.As(err, &re):
		s.probedAt.Store(0)
		s.scripts.Store(scriptsOff)
	default:
		s.probedAt.Store(max(time.Now().UnixNano(), 1))
		s.scripts.Store(scriptsOff)
	}
	return false
}

// errCrossSlot is a batch script refused with CROSSSLOT (a proxy before a cluster).
var errCrossSlot = errors.New("dedup: batch script refused (CROSSSLOT)")

// crossSlot reports a CROSSSLOT refusal, and turns the batch scripts off for good.
func (s *Store) crossSlot(err error) bool {
	if err != nil && redis.HasErrorPrefix(err, "CROSSSLOT") {
		s.probedAt.Store(0)
		s.scripts.Store(scriptsOff)
		return true
	}
	return false
}

var _ driver.Store = (*Store)(nil)

// Option configures a Store.
type Option func(*Store) error

// New returns a Store over c: a *redis.Client, *redis.ClusterClient, *redis.Ring or
// failover client, which the caller owns and closes. A nil client or a bad option is
// an error wrapping ErrInvalidOption.
func New(c redis.UniversalClient, opts ...Option) (*Store, error) {
	if storekit.IsNil(c) {
		return nil, fmt.Errorf("%w: redis client is nil", driver.ErrInvalidOption)
	}
	s := &Store{c: c}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil Option", driver.ErrInvalidOption)
		}
		if err := o(s); err != nil {
			return nil, err
		}
	}
	if _, single := c.(*redis.Client); !single { // a cluster or ring: per key, for good
		s.scripts.Store(scriptsOff)
	}
	switch c := c.(type) { // the options after go-redis's defaults: a timeout ≤ 0 is none
	case *redis.Client:
		o := c.Options()
		s.honours = o.ContextTimeoutEnabled && o.ReadTimeout > 0 && o.WriteTimeout > 0
	case *redis.ClusterClient:
		o := c.Options()
		s.honours = o.ContextTimeoutEnabled && o.ReadTimeout > 0 && o.WriteTimeout > 0
	case *redis.Ring:
		o := c.Options()
		s.honours = o.ContextTimeoutEnabled && o.ReadTimeout > 0 && o.WriteTimeout > 0
	}
	return s, nil
}

// HonoursDeadlines reports whether every call ends by its context's deadline, or by
// the client's ReadTimeout and WriteTimeout at the latest: the client was built with
// ContextTimeoutEnabled and both timeouts. A Deduper then sends a claim or mark with
// nothing else out from its caller's goroutine while the store answers, which saves
// a goroutine hand-off each way (docs/design.md §3); otherwise it waits for each call
// on a goroutine of its own, so that the caller returns by its deadline whatever the
// client does.
func (s *Store) HonoursDeadlines() bool { return s.honours }

func ms(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// process sends cmd on its own and returns its error.
func (s *Store) process(ctx context.Context, cmd redis.Cmder) error {
	_ = s.c.Process(ctx, cmd)
	return cmd.Err()
}

// exec sends cmds in one pipeline; failedRoundTrip reads its error.
func (s *Store) exec(ctx context.Context, cmds ...redis.Cmder) error {
	pipe := s.c.Pipeline()
	_ = pipe.BatchProcess(ctx, cmds...) // one append: Process per command grows the queue log2(n) times
	_, err := pipe.Exec(ctx)
	return err
}

// eval runs a script by its SHA, and by its source on NOSCRIPT.
func (s *Store) eval(ctx context.Context, sc *redis.Script, src, key string, args ...any) (*redis.Cmd, error) {
	cmd := scriptCmd(ctx, "evalsha", sc.Hash(), key, args...)
	err := s.process(ctx, cmd)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		cmd = scriptCmd(ctx, "eval", src, key, args...)
		err = s.process(ctx, cmd)
	}
	return cmd, err
}

// scriptCmd is a one-key script call: evalsha with the SHA, or eval with the source.
func scriptCmd(ctx context.Context, op, body, key string, args ...any) *redis.Cmd {
	return redis.NewCmd(ctx, append([]any{op, body, 1, key}, args...)...)
}

// Claim implements driver.Store. A free key costs one SET NX PX; a key that holds a
// record costs a second round trip, to the claim script, unless recent claims found
// records more often than free keys: then claims go straight to the script.
func (s *Store) Claim(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	if err := storekit.CheckEntries(entries, "lease"); err != nil {
		return nil, err
	}
	switch len(entries) {
	case 0:
		return nil, nil
	case 1:
		return oneAnswer(s.claimOne(ctx, entries[0]))
	}
	return s.claimMany(ctx, entries)
}

// claimOne claims one entry; its error is the call's (failedOne).
func (s *Store) claimOne(ctx context.Context, e driver.Entry) (driver.Answer, error) {
	if a, done, err := s.setNXFirst(ctx, "claim", storekit.StateInProgress, e); done {
		return a, err
	}
	v, err := s.eval(ctx, claimScript, claimLua, e.Key, e.Token, e.Fingerprint, ms(e.TTL))
	if err != nil {
		return failedAnswer("claim", err)
	}
	a, err := claimAnswer(v.Val())
	a.Err = err
	s.sawBatch([]driver.Answer{a})
	return a, nil
}

// failedOne places a batch of one's failure: a failed round trip is the call's; an
// error reply is the entry's.
func failedOne(op string, err error) (entryErr, callErr error) {
	if failedRoundTrip(err) {
		return nil, storekit.StoreErr(op, err)
	}
	return storekit.StoreErr(op, err), nil
}

// failedAnswer is failedOne for a claim or a mark.
func failedAnswer(op string, err error) (driver.Answer, error) {
	entryErr, callErr := failedOne(op, err)
	return driver.Answer{Err: entryErr}, callErr
}

func oneAnswer(a driver.Answer, err error) ([]driver.Answer, error) {
	if err != nil {
		return nil, err
	}
	return []driver.Answer{a}, nil
}

func oneErr(entryErr, callErr error) ([]error, error) {
	if callErr != nil {
		return nil, callErr
	}
	return []error{entryErr}, nil
}

// setNXGet writes a free key with SET NX PX GET, which returns what was there.
func setNXGet(state byte, key, token, fingerprint string, ttl time.Duration) []any {
	return appendSetNXGet(make([]any, 0, 7), key, storekit.Encode(state, token, fingerprint), ms(ttl))
}

func appendSetNXGet(dst []any, key, record, ttlMillis any) []any {
	return append(dst, "set", key, record, "px", ttlMillis, "nx", "get")
}

// batchArgs holds a batch's command arguments in one backing array, each key, each
// run of equal TTLs and each run of equal records boxed once, to save allocations.
type batchArgs struct {
	args  []any
	ttl   time.Duration
	boxed any // ms(ttl), boxed
	// the last record encoded, boxed: a Mark's entries share their call's token
	state     byte
	tok, fp   string
	lastBoxed any
}

func newBatchArgs(n, perEntry int) *batchArgs {
	return &batchArgs{args: make([]any, 0, n*perEntry)}
}

func (b *batchArgs) add(args ...any) []any {
	i := len(b.args)
	b.args = append(b.args, args...)
	return b.since(i)
}

// since returns the arguments from i on, capped so that the next command's cannot
// overwrite them.
func (b *batchArgs) since(i int) []any { return b.args[i:len(b.args):len(b.args)] }

// ms is ms(ttl), boxed once while the TTLs repeat.
func (b *batchArgs) ms(ttl time.Duration) any {
	if b.boxed == nil || ttl != b.ttl {
		b.ttl, b.boxed = ttl, ms(ttl)
	}
	return b.boxed
}

// record is e's record in state, encoded and boxed once while they repeat.
func (b *batchArgs) record(state byte, e driver.Entry) any {
	if b.lastBoxed == nil || state != b.state || e.Token != b.tok || e.Fingerprint != b.fp {
		b.state, b.tok, b.fp = state, e.Token, e.Fingerprint
		b.lastBoxed = storekit.Encode(state, e.Token, e.Fingerprint)
	}
	return b.lastBoxed
}

// setNXGet is the package's setNXGet for e, its key boxed by the caller.
func (b *batchArgs) setNXGet(state byte, key any, e driver.Entry) []any {
	i := len(b.args)
	b.args = appendSetNXGet(b.args, key, b.record(state, e), b.ms(e.TTL))
	return b.since(i)
}

// setDone is SET key <DONE record> PX retention for e.
func (b *batchArgs) setDone(e driver.Entry) []any {
	return b.add("set", e.Key, b.record(storekit.StateDone, e), "px", b.ms(e.TTL))
}

// setNX is SET key <record> PX ttl NX for e: OK when the key was free, nil (no GET:
// the claim script reads what is there) when not. An OK reply also spares go-redis
// its error path.
func (b *batchArgs) setNX(state byte, e driver.Entry) []any {
	return b.add("set", e.Key, b.record(state, e), "px", b.ms(e.TTL), "nx")
}

func claimAnswer(v any) (driver.Answer, error) {
	a, ok := v.([]any)
	if !ok || len(a) < 2 || len(a) > 3 {
		return driver.Answer{}, storekit.StoreErr("claim", fmt.Errorf("unexpected reply %T", v))
	}
	st, ok1 := a[0].(int64)
	ttl, ok2 := a[1].(int64)
	if !ok1 || !ok2 || st < int64(driver.StatusAcquired) || st > int64(driver.StatusConflict) {
		return driver.Answer{}, storekit.StoreErr("claim", fmt.Errorf("unexpected reply %v", a))
	}
	ans := driver.Answer{Status: driver.Status(st)}
	if ans.Status == driver.StatusInProgress || ans.Status == driver.StatusDuplicate {
		ans.TTL = time.Duration(max(ttl, 0)) * time.Millisecond
	}
	if len(a) == 3 { // a DONE record with a reply: the record itself
		v, _ := a[2].(string)
		r, ok := storekit.Parse(v)
		if !ok || !r.HasReply || ans.Status != driver.StatusDuplicate {
			return driver.Answer{}, storekit.StoreErr("claim", driver.ErrBadRecord)
		}
		ans.Reply, ans.HasReply = r.Reply, true
	}
	return ans, nil
}

// Complete implements driver.Store. An entry without a reply is one SET PX of its
// DONE record, no script: DONE whoever holds the key. One with a reply goes to the
// complete script, which checks the owner token, so that the first reply wins. A
// batch of both is two round trips. WithWaitReplicas adds a WAIT.
func (s *Store) Complete(ctx context.Context, entries []driver.Entry) ([]error, error) {
	if err := storekit.CheckEntries(entries, "retention"); err != nil {
		return nil, err
	}
	replies := 0
	for _, e := range entries {
		if e.HasReply {
			replies++
		}
	}
	switch {
	case len(entries) == 0:
		return nil, nil
	case s.wait != nil:
		return s.completeManyWaiting(ctx, entries)
	case replies == 0:
		return s.completeDone(ctx, entries)
	case len(entries) == 1:
		return oneErr(s.completeOne(ctx, entries[0]))
	case replies == len(entries):
		return s.completeMany(ctx, entries)
	}
	var plain, scripted []int
	for i, e := range entries {
		if e.HasReply {
			scripted = append(scripted, i)
		} else {
			plain = append(plain, i)
		}
	}
	out := make([]error, len(entries))
	for _, part := range [][]int{plain, scripted} {
		errs, err := s.Complete(ctx, entriesAt(entries, part))
		if err != nil {
			return nil, err
		}
		for j, i := range part {
			out[i] = errs[j]
		}
	}
	return out, nil
}

// completeDone writes each entry's DONE record with SET PX, in one round trip.
func (s *Store) completeDone(ctx context.Context, entries []driver.Entry) ([]error, error) {
	args := newBatchArgs(len(entries), 5)
	cmds := make([]*redis.StatusCmd, len(entries))
	for i, e := range entries {
		cmds[i] = redis.NewStatusCmd(ctx, args.setDone(e)...)
	}
	if len(cmds) == 1 {
		if err := s.process(ctx, cmds[0]); err != nil {
			return oneErr(failedOne("complete", err))
		}
		return []error{nil}, nil
	}
	sent := make([]redis.Cmder, len(cmds))
	for i, c := range cmds {
		sent[i] = c
	}
	if err := s.exec(ctx, sent...); failedRoundTrip(err) {
		return nil, storekit.StoreErr("complete", err)
	}
	out := make([]error, len(entries))
	for i, c := range cmds {
		if err := c.Err(); err != nil {
			out[i] = storekit.StoreErr("complete", err)
		}
	}
	return out, nil
}

// completeOne completes one entry.
func (s *Store) completeOne(ctx context.Context, e driver.Entry) (entryErr, callErr error) {
	cmd, err := s.eval(ctx, completeScript, completeLua, e.Key, completeArgs(e)...)
	return ownedOne("complete", cmd, err)
}

func completeArgs(e driver.Entry) []any {
	if e.HasReply {
		return []any{e.Token, ms(e.TTL), e.Reply}
	}
	return []any{e.Token, ms(e.TTL)}
}

func ownedReply(op string, cmd *redis.Cmd, err error) error {
	if err != nil {
		return storekit.StoreErr(op, err)
	}
	if n, err := cmd.Int(); err != nil {
		return storekit.StoreErr(op, err)
	} else if n != 1 {
		return driver.ErrLeaseLost
	}
	return nil
}

// ownedOne is ownedReply for a batch of one (failedOne places a failure).
func ownedOne(op string, cmd *redis.Cmd, err error) (entryErr, callErr error) {
	if err != nil {
		return failedOne(op, err)
	}
	return ownedReply(op, cmd, nil), nil
}

// Release implements driver.Store: the release script deletes a record IN PROGRESS
// under the entry's token. Entry.TTL is not read.
func (s *Store) Release(ctx context.Context, entries []driver.Entry) ([]error, error) {
	if err := storekit.CheckEntries(entries, ""); err != nil {
		return nil, err
	}
	switch len(entries) {
	case 0:
		return nil, nil
	case 1:
		e := entries[0]
		if _, err := s.eval(ctx, releaseScript, releaseLua, e.Key, e.Token); err != nil {
			return oneErr(failedOne("release", err))
		}
		return []error{nil}, nil
	}
	cmds, err := s.runScripts(ctx, releaseScript, releaseLua, entries, func(e driver.Entry) []any {
		return []any{e.Token}
	})
	if err != nil {
		return nil, err
	}
	out := make([]error, len(entries))
	for i, c := range cmds {
		if err := c.Err(); err != nil {
			out[i] = storekit.StoreErr("release", err)
		}
	}
	return out, nil
}

// Extend implements driver.Store: the extend script renews the lease of a record IN
// PROGRESS under the entry's token.
func (s *Store) Extend(ctx context.Context, entries []driver.Entry) ([]error, error) {
	if err := storekit.CheckEntries(entries, "lease"); err != nil {
		return nil, err
	}
	switch len(entries) {
	case 0:
		return nil, nil
	case 1:
		e := entries[0]
		cmd, err := s.eval(ctx, extendScript, extendLua, e.Key, e.Token, ms(e.TTL))
		return oneErr(ownedOne("extend", cmd, err))
	}
	cmds, err := s.runScripts(ctx, extendScript, extendLua, entries, extendArgs)
	if err != nil {
		return nil, err
	}
	out := make([]error, len(entries))
	for i, c := range cmds {
		out[i] = ownedReply("extend", c, c.Err())
	}
	return out, nil
}

func extendArgs(e driver.Entry) []any { return []any{e.Token, ms(e.TTL)} }

// Mark implements driver.Store. A free key costs one SET NX PX, which writes the DONE
// record; a key that holds a record costs a second round trip, a SET NX PX GET, which
// writes it if the key is free by then and returns what is there otherwise. While
// recent claims and marks find records more often than free keys (findsRecords), the
// SET NX PX GET goes first. With WithWaitReplicas, SET NX PX GET and a WAIT.
func (s *Store) Mark(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	if err := storekit.CheckEntries(entries, "retention"); err != nil {
		return nil, err
	}
	switch {
	case len(entries) == 0:
		return nil, nil
	case s.wait != nil:
		return s.markManyWaiting(ctx, entries)
	case len(entries) == 1:
		return oneAnswer(s.markOne(ctx, entries[0]))
	}
	return s.markMany(ctx, entries)
}

// setNXFirst sends e's SET NX PX of a record in state, unless recent calls found
// records (findsRecords). done reports an answer: Acquired for a free key, or the
// failure of the command; a key that holds a record is for the caller to read.
func (s *Store) setNXFirst(ctx context.Context, op string, state byte, e driver.Entry) (a driver.Answer, done bool, err error) {
	if s.findsRecords() {
		return a, false, nil
	}
	switch err := s.process(ctx, redis.NewStatusCmd(ctx, newBatchArgs(1, 6).setNX(state, e)...)); {
	case err == nil: // OK: the key was free
		s.sawClaims(0, 1)
		return driver.Answer{Status: driver.StatusAcquired}, true, nil
	case !errors.Is(err, redis.Nil):
		a, err = failedAnswer(op, err)
		return a, true, err
	}
	return a, false, nil
}

func (s *Store) markOne(ctx context.Context, e driver.Entry) (driver.Answer, error) {
	if a, done, err := s.setNXFirst(ctx, "mark", storekit.StateDone, e); done {
		return a, err
	}
	cmd := redis.NewStatusCmd(ctx, setNXGet(storekit.StateDone, e.Key, e.Token, e.Fingerprint, e.TTL)...)
	err := s.process(ctx, cmd)
	if err != nil && !errors.Is(err, redis.Nil) {
		return failedAnswer("mark", err)
	}
	a, err := markAnswer(cmd.Val(), err, e.Token, e.Fingerprint)
	a.Err = err
	s.sawBatch([]driver.Answer{a})
	return a, nil
}

// markAnswer reads a Mark's reply: old, the previous value, or err redis.Nil (free).
func markAnswer(old string, err error, token, fingerprint string) (driver.Answer, error) {
	if errors.Is(err, redis.Nil) {
		return driver.Answer{Status: driver.StatusAcquired}, nil
	}
	r, ok := storekit.Parse(old)
	switch {
	case !ok:
		return driver.Answer{}, storekit.StoreErr("mark", driver.ErrBadRecord)
	case r.State == storekit.StateDone && r.Token == token:
		return driver.Answer{Status: driver.StatusAcquired}, nil // our own mark, retried
	case r.State == storekit.StateDone && storekit.FingerprintsDiffer(r.FP, fingerprint):
		return driver.Answer{Status: driver.StatusConflict}, nil
	case r.State == storekit.StateInProgress:
		return driver.Answer{Status: driver.StatusInProgress}, nil // TTL unknown: SET ... GET does not say
	default:
		return driver.Answer{Status: driver.StatusDuplicate}, nil
	}
}

// claimMany is Claim of several entries: claimManySingle on a single server, else one
// pipeline of SET NX PX GET, PTTL and GET per entry. A pipeline is not a transaction,
// so the PTTL counts only if the GET still finds the value the SET found. A batch that
// names a key twice goes as claim scripts, so each entry sees the ones before it.
func (s *Store) claimMany(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	if s.batchScripts(ctx) {
		return s.claimManySingle(ctx, entries)
	}
	if repeatsAKey(entries) {
		return s.claimManyScripts(ctx, entries)
	}
	sets, ttls, gets, sent := claimCmds(ctx, entries)
	if err := s.exec(ctx, sent...); failedRoundTrip(err) {
		return nil, storekit.StoreErr("claim", err)
	}
	out := make([]driver.Answer, len(entries))
	var own []int // entries that found their own claim: to renew
	for i, e := range entries {
		old, err := sets[i].Result()
		if errors.Is(err, redis.Nil) {
			out[i] = driver.Answer{Status: driver.StatusAcquired}
			continue
		}
		if err != nil {
			out[i].Err = storekit.StoreErr("claim", err)
			continue
		}
		pttl, perr := ttls[i].Int64()
		now, gerr := gets[i].Text()
		same := perr == nil && gerr == nil && now == old // the TTL is that record's
		var mine bool
		if out[i], mine = foundAnswer(e, old, pttl, same); mine {
			own = append(own, i)
		}
	}
	if len(own) > 0 {
		s.renewOwnClaims(ctx, entries, own, out)
	}
	return out, nil
}

// foundAnswer answers e's claim, which found old with PTTL pttl; same says the PTTL is
// old's. mine reports e's own claim found again, to renew, with no answer yet.
func foundAnswer(e driver.Entry, old string, pttl int64, same bool) (a driver.Answer, mine bool) {
	r, ok := storekit.Parse(old)
	ttl := time.Duration(max(pttl, 0)) * time.Millisecond // -2 gone, -1 no expiry
	switch {
	case !ok:
		a.Err = storekit.StoreErr("claim", driver.ErrBadRecord)
	case r.State == storekit.StateInProgress && r.Token == e.Token:
		return driver.Answer{}, true
	case r.State == storekit.StateInProgress && same:
		a = driver.Answer{Status: driver.StatusInProgress, TTL: ttl}
	case r.State == storekit.StateInProgress: // completed, released or taken meanwhile
		a = driver.Answer{Status: driver.StatusInProgress, TTL: min(ttl, e.TTL)}
	case storekit.FingerprintsDiffer(r.FP, e.Fingerprint):
		a = driver.Answer{Status: driver.StatusConflict}
	case same:
		a = driver.Answer{Status: driver.StatusDuplicate, TTL: ttl}
	default: // the record ended meanwhile: DONE when seen, for how long unknown
		a = driver.Answer{Status: driver.StatusDuplicate}
	}
	if a.Status == driver.StatusDuplicate && r.HasReply {
		a.Reply, a.HasReply = r.Reply, true
	}
	return a, false
}

// claimManySingle is claimMany on a single server: SET NX PX GET per entry, then the
// claim_many script for those that found a record. A key named twice sees its first.
func (s *Store) claimManySingle(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	if s.findsRecords() {
		answers, err := s.claimManyScript(ctx, entries)
		if errors.Is(err, errCrossSlot) { // nothing ran: the claim script per entry
			answers, err = s.claimManyScripts(ctx, entries)
		}
		if err == nil {
			s.sawBatch(answers)
		}
		return answers, err
	}
	cmds, sent := setNXCmds(ctx, storekit.StateInProgress, entries, false)
	if err := s.exec(ctx, sent...); failedRoundTrip(err) {
		return nil, storekit.StoreErr("claim", err)
	}
	out := make([]driver.Answer, len(entries))
	var found []int
	for i, c := range cmds {
		switch err := c.Err(); {
		case err == nil: // OK: the key was free
			out[i] = driver.Answer{Status: driver.StatusAcquired}
		case errors.Is(err, redis.Nil):
			found = append(found, i)
		default:
			out[i].Err = storekit.StoreErr("claim", err)
		}
	}
	s.sawClaims(len(found), len(entries)-len(found))
	if len(found) == 0 {
		return out, nil
	}
	again := entriesAt(entries, found)
	answers, err := s.claimManyScript(ctx, again)
	if errors.Is(err, errCrossSlot) { // nothing ran: the claim script per entry
		answers, err = s.claimManyScripts(ctx, again)
	}
	for j, i := range found {
		if err != nil {
			out[i].Err = err
		} else {
			out[i] = answers[j]
		}
	}
	return out, nil
}

func (s *Store) claimManyScript(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	vals, err := s.runBatchScript(ctx, claimManyScript, claimManyLua, entries, 2, func(args *batchArgs, e driver.Entry) {
		args.args = append(args.args, storekit.Encode(storekit.StateInProgress, e.Token, e.Fingerprint), args.ms(e.TTL))
	})
	if errors.Is(err, errCrossSlot) {
		return nil, err
	}
	if err != nil {
		return nil, storekit.StoreErr("claim", err)
	}
	out := make([]driver.Answer, len(entries))
	for i, v := range vals {
		switch v := v.(type) {
		case int64:
			if v == 1 {
				out[i] = driver.Answer{Status: driver.StatusAcquired}
				continue
			}
		case error:
			out[i].Err = storekit.StoreErr("claim", v)
			continue
		case []any:
			if len(v) != 2 {
				break
			}
			pttl, ok1 := v[0].(int64)
			old, ok2 := v[1].(string)
			if ok1 && ok2 {
				a, mine := foundAnswer(entries[i], old, pttl, true)
				if !mine { // the script renews our own claim: never found here
					out[i] = a
					continue
				}
			}
		}
		out[i].Err = storekit.StoreErr("claim", fmt.Errorf("unexpected reply %v", v))
	}
	return out, nil
}

// completeManyScript is completeMany on a single server: the complete_many script.
func (s *Store) completeManyScript(ctx context.Context, entries []driver.Entry) ([]error, error) {
	vals, err := s.runBatchScript(ctx, completeManyScript, completeManyLua, entries, 4, completeManyArgs)
	if errors.Is(err, errCrossSlot) {
		return nil, err
	}
	if err != nil {
		return nil, storekit.StoreErr("complete", err)
	}
	out := make([]error, len(entries))
	for i, v := range vals {
		switch v := v.(type) {
		case int64:
			switch v {
			case 1:
				continue
			case 0:
				out[i] = driver.ErrLeaseLost
				continue
			}
		case error:
			out[i] = storekit.StoreErr("complete", v)
			continue
		}
		out[i] = storekit.StoreErr("complete", fmt.Errorf("unexpected reply %v", v))
	}
	return out, nil
}

// completeManyCmds builds the complete_many calls for entries (by SHA).
func completeManyCmds(ctx context.Context, entries []driver.Entry) []*redis.Cmd {
	return batchScriptCmds(ctx, completeManyScript, entries, 4, completeManyArgs)
}

func completeManyArgs(args *batchArgs, e driver.Entry) {
	if e.HasReply {
		args.args = append(args.args, e.Token, args.ms(e.TTL), "1", e.Reply)
	} else {
		args.args = append(args.args, e.Token, args.ms(e.TTL), "0")
	}
}

// batchScriptCmds builds the calls of the batch script sc for entries, maxScriptKeys
// keys a call; argv appends an entry's arguments (at most perEntry of them).
func batchScriptCmds(ctx context.Context, sc *redis.Script, entries []driver.Entry, perEntry int, argv func(*batchArgs, driver.Entry)) []*redis.Cmd {
	calls := (len(entries) + maxScriptKeys - 1) / maxScriptKeys
	args := newBatchArgs(1, calls*3+len(entries)*(1+perEntry))
	cmds := make([]*redis.Cmd, calls)
	for c := range cmds {
		part := entries[c*maxScriptKeys : min(len(entries), (c+1)*maxScriptKeys)]
		i := len(args.args)
		args.args = append(args.args, "evalsha", sc.Hash(), len(part))
		for _, e := range part {
			args.args = append(args.args, e.Key)
		}
		for _, e := range part {
			argv(args, e)
		}
		cmds[c] = redis.NewCmd(ctx, args.since(i)...)
	}
	return cmds
}

// spreadBatchReplies returns per entry its part of its call's reply, or its error.
func spreadBatchReplies(cmds []*redis.Cmd, n int) []any {
	out := make([]any, 0, n)
	for c, cmd := range cmds {
		k := min(n, (c+1)*maxScriptKeys) - c*maxScriptKeys
		v, err := cmd.Result()
		a, ok := v.([]any)
		if err == nil && (!ok || len(a) != k) {
			err = fmt.Errorf("unexpected reply %T of %d for %d keys", v, len(a), k)
		}
		for i := range k {
			if err != nil {
				out = append(out, err)
			} else {
				out = append(out, a[i])
			}
		}
	}
	return out
}

// runBatchScript calls sc for entries in one round trip (NOSCRIPT calls again as
// EVAL); err is a failed round trip or errCrossSlot.
func (s *Store) runBatchScript(ctx context.Context, sc *redis.Script, src string, entries []driver.Entry, perEntry int, argv func(*batchArgs, driver.Entry)) ([]any, error) {
	cmds := batchScriptCmds(ctx, sc, entries, perEntry, argv)
	sent := make([]redis.Cmder, len(cmds))
	for c, cmd := range cmds {
		sent[c] = cmd
	}
	if err := s.exec(ctx, sent...); failedRoundTrip(err) {
		return nil, err
	}
	for _, cmd := range cmds {
		if s.crossSlot(cmd.Err()) {
			return nil, errCrossSlot
		}
	}
	// a failure of the EVAL round trip is on each call it resent
	_ = evalAgain(ctx, s.exec, cmds, src)
	return spreadBatchReplies(cmds, len(entries)), nil
}

// evalAgain resends the calls of cmds answered NOSCRIPT as EVAL of src, in one round
// trip, in their places. Its error is that round trip's, which each of them holds.
func evalAgain(ctx context.Context, send func(context.Context, ...redis.Cmder) error, cmds []*redis.Cmd, src string) error {
	var again []redis.Cmder
	for c, cmd := range cmds {
		if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			a := slices.Clone(cmd.Args())
			a[0], a[1] = "eval", src
			cmds[c] = redis.NewCmd(ctx, a...)
			again = append(again, cmds[c])
		}
	}
	if len(again) == 0 {
		return nil
	}
	if err := send(ctx, again...); failedRoundTrip(err) {
		return err
	}
	return nil
}

// renewOwnClaims renews the leases of the entries own, which found their own claim,
// and claims again those whose claim ran out meanwhile.
func (s *Store) renewOwnClaims(ctx context.Context, entries []driver.Entry, own []int, out []driver.Answer) {
	cmds, err := s.runScripts(ctx, extendScript, extendLua, entriesAt(entries, own), extendArgs)
	var lapsed []int
	for j, i := range own {
		rerr := err
		if rerr == nil {
			rerr = ownedReply("claim", cmds[j], cmds[j].Err())
		}
		switch {
		case rerr == nil:
			out[i] = driver.Answer{Status: driver.StatusAcquired}
		case errors.Is(rerr, driver.ErrLeaseLost): // not ours any more: claim it as anyone would
			lapsed = append(lapsed, i)
		default:
			out[i].Err = storekit.StoreErr("claim", rerr)
		}
	}
	if len(lapsed) == 0 {
		return
	}
	again, err := s.claimManyScripts(ctx, entriesAt(entries, lapsed))
	for j, i := range lapsed {
		if err != nil {
			out[i].Err = err
		} else {
			out[i] = again[j]
		}
	}
}

func entriesAt(entries []driver.Entry, idx []int) []driver.Entry {
	es := make([]driver.Entry, len(idx))
	for j, i := range idx {
		es[j] = entries[i]
	}
	return es
}

func repeatsAKey(entries []driver.Entry) bool {
	seen := make(map[string]struct{}, len(entries))
	for _, e := range entries {
		if _, ok := seen[e.Key]; ok {
			return true
		}
		seen[e.Key] = struct{}{}
	}
	return false
}

// claimManyScripts is claimMany as one pipeline of claim scripts.
func (s *Store) claimManyScripts(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	cmds, err := s.runScripts(ctx, claimScript, claimLua, entries, func(e driver.Entry) []any {
		return []any{e.Token, e.Fingerprint, ms(e.TTL)}
	})
	if err != nil {
		return nil, err
	}
	out := make([]driver.Answer, len(entries))
	for i, c := range cmds {
		v, err := c.Result()
		if err != nil {
			out[i].Err = storekit.StoreErr("claim", err)
			continue
		}
		if out[i], err = claimAnswer(v); err != nil {
			out[i].Err = err
		}
	}
	return out, nil
}

// completeMany is Complete of several entries in one round trip: the complete_many
// script on a single server, else the complete script per entry.
func (s *Store) completeMany(ctx context.Context, entries []driver.Entry) ([]error, error) {
	if s.batchScripts(ctx) {
		out, err := s.completeManyScript(ctx, entries)
		if !errors.Is(err, errCrossSlot) {
			return out, err
		}
	}
	cmds, err := s.runScripts(ctx, completeScript, completeLua, entries, completeArgs)
	if err != nil {
		return nil, err
	}
	out := make([]error, len(entries))
	for i, c := range cmds {
		out[i] = ownedReply("complete", c, c.Err())
	}
	return out, nil
}

// markMany is Mark of several entries: one pipeline of SET NX PX, then one of SET NX
// PX GET for those that found a record (or SET NX PX GET at once: findsRecords).
func (s *Store) markMany(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	out, err := s.marks(ctx, entries, s.findsRecords())
	if err == nil {
		s.sawBatch(out)
	}
	return out, err
}

// marks sends entries' SET NX PX, with GET when get is true, then SET NX PX GET for
// those that found a record.
func (s *Store) marks(ctx context.Context, entries []driver.Entry, get bool) ([]driver.Answer, error) {
	cmds, sent := setNXCmds(ctx, storekit.StateDone, entries, get)
	if err := s.exec(ctx, sent...); failedRoundTrip(err) {
		return nil, storekit.StoreErr("mark", err)
	}
	out := make([]driver.Answer, len(entries))
	var found []int
	for i, c := range cmds {
		old, err := c.Result()
		switch {
		case err != nil && !errors.Is(err, redis.Nil):
			out[i].Err = storekit.StoreErr("mark", err)
		case !get && err == nil: // OK: the key was free
			out[i].Status = driver.StatusAcquired
		case !get:
			found = append(found, i)
		default:
			out[i], err = markAnswer(old, err, entries[i].Token, entries[i].Fingerprint)
			out[i].Err = err
		}
	}
	if len(found) > 0 {
		again, err := s.marks(ctx, entriesAt(entries, found), true)
		for j, i := range found {
			if out[i].Err = err; err == nil {
				out[i] = again[j]
			}
		}
	}
	return out, nil
}

// claimCmds builds claimMany's SET NX PX GET, PTTL and GET per entry.
func claimCmds(ctx context.Context, entries []driver.Entry) (sets []*redis.StatusCmd, ttls, gets []*redis.Cmd, sent []redis.Cmder) {
	sets = make([]*redis.StatusCmd, len(entries))
	ttls = make([]*redis.Cmd, len(entries))
	gets = make([]*redis.Cmd, len(entries))
	sent = make([]redis.Cmder, 0, 3*len(entries))
	args := newBatchArgs(len(entries), 7+2+2)
	for i, e := range entries {
		key := any(e.Key)
		sets[i] = redis.NewStatusCmd(ctx, args.setNXGet(storekit.StateInProgress, key, e)...)
		ttls[i] = redis.NewCmd(ctx, args.add("pttl", key)...)
		gets[i] = redis.NewCmd(ctx, args.add("get", key)...)
		sent = append(sent, sets[i], ttls[i], gets[i])
	}
	return sets, ttls, gets, sent
}

// setNXCmds builds a SET NX PX of a record in state per entry, with GET when get is
// true: a Mark's (DONE), or a single server's Claim of several (IN PROGRESS, no GET).
func setNXCmds(ctx context.Context, state byte, entries []driver.Entry, get bool) (cmds []*redis.StatusCmd, sent []redis.Cmder) {
	cmds = make([]*redis.StatusCmd, len(entries))
	sent = make([]redis.Cmder, len(entries))
	per := 6 // SET key rec PX ms NX
	if get {
		per = 7 // GET
	}
	args := newBatchArgs(len(entries), per)
	for i, e := range entries {
		if get {
			cmds[i] = redis.NewStatusCmd(ctx, args.setNXGet(state, e.Key, e)...)
		} else {
			cmds[i] = redis.NewStatusCmd(ctx, args.setNX(state, e)...)
		}
		sent[i] = cmds[i]
	}
	return cmds, sent
}

// runScripts sends one EVALSHA per entry in one round trip, NOSCRIPT ones again as EVAL.
func (s *Store) runScripts(ctx context.Context, sc *redis.Script, src string, entries []driver.Entry, args func(driver.Entry) []any) ([]*redis.Cmd, error) {
	return s.runScriptsVia(ctx, s.exec, sc, src, entries, args)
}

// runScriptsVia is runScripts, each round trip sent by send (exec, or pipe.doAll).
func (s *Store) runScriptsVia(ctx context.Context, send func(context.Context, ...redis.Cmder) error, sc *redis.Script, src string, entries []driver.Entry, args func(driver.Entry) []any) ([]*redis.Cmd, error) {
	if len(entries) == 0 {
		return nil, nil
	}
	cmds := make([]*redis.Cmd, len(entries))
	sent := make([]redis.Cmder, len(entries))
	for i, e := range entries {
		cmds[i] = scriptCmd(ctx, "evalsha", sc.Hash(), e.Key, args(e)...)
		sent[i] = cmds[i]
	}
	if err := send(ctx, sent...); failedRoundTrip(err) {
		return nil, storekit.StoreErr("pipeline", err)
	}
	// a failure is on each resent command; the others keep their answers
	_ = evalAgain(ctx, send, cmds, src)
	return cmds, nil
}

// failedRoundTrip tells a failure of the whole round trip from a per-command reply
// (an error reply or a nil, which stays on its own command).
func failedRoundTrip(err error) bool {
	var re redis.Error
	return err != nil && !errors.As(err, &re)
}

// Ping implements driver.Pinger with one PING, which dedup's breaker probes with.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.process(ctx, redis.NewStatusCmd(ctx, "ping")); err != nil {
		return storekit.StoreErr("ping", err)
	}
	return nil
}
