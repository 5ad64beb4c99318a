package dedup

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
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
)

// RedisStore is the Store backed by Redis 7 or later. Claim, Complete, Release and
// Extend are Lua scripts (one key each, so they run unchanged on Redis Cluster); Mark is
// a single SET NX PX GET. Batch calls are one pipeline.
type RedisStore struct {
	c    redis.UniversalClient
	wait *replicaWait // WithWaitReplicas (redis_wait.go); nil: DONE writes do not wait
}

var _ Store = (*RedisStore)(nil)

// RedisOption configures a RedisStore.
type RedisOption func(*RedisStore) error

// NewRedisStore returns a store over c: a *redis.Client, *redis.ClusterClient,
// *redis.Ring or failover client. The caller owns c and closes it. A nil client or a
// bad option is an error wrapping ErrInvalidOption.
func NewRedisStore(c redis.UniversalClient, opts ...RedisOption) (*RedisStore, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: redis client is nil", ErrInvalidOption)
	}
	s := &RedisStore{c: c}
	for _, o := range opts {
		if err := o(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func ms(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

func storeErr(op string, err error) error {
	if errors.Is(err, ErrStoreUnavailable) {
		return err
	}
	if strings.Contains(err.Error(), ErrBadRecord.Error()) {
		return fmt.Errorf("%w: %s: %w", ErrStoreUnavailable, op, ErrBadRecord)
	}
	return fmt.Errorf("%w: %s: %w", ErrStoreUnavailable, op, err)
}

// Claim implements Store.
func (s *RedisStore) Claim(ctx context.Context, key, token, fingerprint string, lease time.Duration) (Answer, error) {
	if err := checkEntry(Entry{Token: token, TTL: lease}, "lease"); err != nil {
		return Answer{}, err
	}
	v, err := claimScript.Run(ctx, s.c, []string{key}, token, fingerprint, ms(lease)).Result()
	if err != nil {
		return Answer{}, storeErr("claim", err)
	}
	return claimAnswer(v)
}

func claimAnswer(v any) (Answer, error) {
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		return Answer{}, storeErr("claim", fmt.Errorf("unexpected reply %T", v))
	}
	st, ok1 := a[0].(int64)
	ttl, ok2 := a[1].(int64)
	if !ok1 || !ok2 || st < int64(StatusAcquired) || st > int64(StatusConflict) {
		return Answer{}, storeErr("claim", fmt.Errorf("unexpected reply %v", a))
	}
	ans := Answer{Status: Status(st)}
	if ans.Status == StatusInProgress || ans.Status == StatusDuplicate {
		ans.TTL = time.Duration(max(ttl, 0)) * time.Millisecond
	}
	return ans, nil
}

// Complete implements Store.
func (s *RedisStore) Complete(ctx context.Context, key, token string, retention time.Duration) error {
	if err := checkEntry(Entry{Token: token, TTL: retention}, "retention"); err != nil {
		return err
	}
	if s.wait != nil {
		return s.completeWaiting(ctx, key, token, retention)
	}
	n, err := completeScript.Run(ctx, s.c, []string{key}, token, ms(retention)).Int()
	return ownedReply("complete", n, err)
}

func ownedReply(op string, n int, err error) error {
	if err != nil {
		return storeErr(op, err)
	}
	if n != 1 {
		return ErrLeaseLost
	}
	return nil
}

// Release implements Store.
func (s *RedisStore) Release(ctx context.Context, key, token string) error {
	if err := checkToken(token); err != nil {
		return err
	}
	if err := releaseScript.Run(ctx, s.c, []string{key}, token).Err(); err != nil {
		return storeErr("release", err)
	}
	return nil
}

// Extend implements Store.
func (s *RedisStore) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if err := checkEntry(Entry{Token: token, TTL: lease}, "lease"); err != nil {
		return err
	}
	n, err := extendScript.Run(ctx, s.c, []string{key}, token, ms(lease)).Int()
	return ownedReply("extend", n, err)
}

// Mark implements Store with one SET NX PX GET: the reply is the previous value, so one
// command both writes the DONE record and says what was there.
func (s *RedisStore) Mark(ctx context.Context, key, token, fingerprint string, retention time.Duration) (Answer, error) {
	if err := checkEntry(Entry{Token: token, TTL: retention}, "retention"); err != nil {
		return Answer{}, err
	}
	if s.wait != nil {
		return s.markWaiting(ctx, key, token, fingerprint, retention)
	}
	cmd := s.c.SetArgs(ctx, key, encodeRecord(stateDone, token, fingerprint), markArgs(retention))
	return markAnswer(cmd, token, fingerprint)
}

func markArgs(retention time.Duration) redis.SetArgs {
	return redis.SetArgs{Mode: "NX", TTL: time.Duration(ms(retention)) * time.Millisecond, Get: true}
}

func markAnswer(cmd *redis.StatusCmd, token, fingerprint string) (Answer, error) {
	old, err := cmd.Result()
	if errors.Is(err, redis.Nil) {
		return Answer{Status: StatusAcquired}, nil
	}
	if err != nil {
		return Answer{}, storeErr("mark", err)
	}
	state, tok, fp, ok := decodeRecord(old)
	switch {
	case !ok:
		return Answer{}, storeErr("mark", ErrBadRecord)
	case state == stateDone && tok == token:
		return Answer{Status: StatusAcquired}, nil // our own mark, retried
	case state == stateDone && fingerprintsDiffer(fp, fingerprint):
		return Answer{Status: StatusConflict}, nil
	case state == stateInProgress:
		return Answer{Status: StatusInProgress}, nil // TTL unknown: SET ... GET does not say
	default:
		return Answer{Status: StatusDuplicate}, nil
	}
}

// ClaimMany implements Store: one pipeline of claim scripts. Should the server have
// lost its script cache (a restart), the affected claims are sent again as EVAL.
func (s *RedisStore) ClaimMany(ctx context.Context, entries []Entry) ([]Answer, error) {
	for _, e := range entries {
		if err := checkEntry(e, "lease"); err != nil {
			return nil, err
		}
	}
	cmds, err := s.runScripts(ctx, claimScript, entries, func(e Entry) []any {
		return []any{e.Token, e.Fingerprint, ms(e.TTL)}
	})
	if err != nil {
		return nil, err
	}
	out := make([]Answer, len(entries))
	for i, c := range cmds {
		v, err := c.Result()
		if err != nil {
			out[i].Err = storeErr("claim", err)
			continue
		}
		if out[i], err = claimAnswer(v); err != nil {
			out[i].Err = err
		}
	}
	return out, nil
}

// CompleteMany implements Store in one pipeline.
func (s *RedisStore) CompleteMany(ctx context.Context, entries []Entry) ([]error, error) {
	for _, e := range entries {
		if err := checkEntry(e, "retention"); err != nil {
			return nil, err
		}
	}
	if s.wait != nil {
		return s.completeManyWaiting(ctx, entries)
	}
	cmds, err := s.runScripts(ctx, completeScript, entries, func(e Entry) []any {
		return []any{e.Token, ms(e.TTL)}
	})
	if err != nil {
		return nil, err
	}
	out := make([]error, len(entries))
	for i, c := range cmds {
		n, err := c.Int()
		out[i] = ownedReply("complete", n, err)
	}
	return out, nil
}

// MarkMany implements Store in one pipeline of SET NX PX GET.
func (s *RedisStore) MarkMany(ctx context.Context, entries []Entry) ([]Answer, error) {
	for _, e := range entries {
		if err := checkEntry(e, "retention"); err != nil {
			return nil, err
		}
	}
	if len(entries) == 0 {
		return nil, nil
	}
	if s.wait != nil {
		return s.markManyWaiting(ctx, entries)
	}
	pipe := s.c.Pipeline()
	cmds := make([]*redis.StatusCmd, len(entries))
	for i, e := range entries {
		cmds[i] = pipe.SetArgs(ctx, e.Key, encodeRecord(stateDone, e.Token, e.Fingerprint), markArgs(e.TTL))
	}
	if _, err := pipe.Exec(ctx); failedRoundTrip(err) {
		return nil, storeErr("mark", err)
	}
	out := make([]Answer, len(entries))
	for i, c := range cmds {
		a, err := markAnswer(c, entries[i].Token, entries[i].Fingerprint)
		a.Err = err
		out[i] = a
	}
	return out, nil
}

// runScripts sends one EVALSHA per entry in a single pipeline. Entries answered
// NOSCRIPT (the server lost its script cache) go again, as EVAL, in a second pipeline.
func (s *RedisStore) runScripts(ctx context.Context, sc *redis.Script, entries []Entry, args func(Entry) []any) ([]*redis.Cmd, error) {
	if len(entries) == 0 {
		return nil, nil
	}
	pipe := s.c.Pipeline()
	cmds := make([]*redis.Cmd, len(entries))
	for i, e := range entries {
		cmds[i] = sc.EvalSha(ctx, pipe, []string{e.Key}, args(e)...)
	}
	if _, err := pipe.Exec(ctx); failedRoundTrip(err) {
		return nil, storeErr("pipeline", err)
	}
	var again redis.Pipeliner
	for i, c := range cmds {
		if err := c.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			if again == nil {
				again = s.c.Pipeline()
			}
			cmds[i] = sc.Eval(ctx, again, []string{entries[i].Key}, args(entries[i])...)
		}
	}
	if again != nil {
		// A failure here is already on each re-sent command; the others have their
		// answers and keep them (a claim that was acquired is reported as acquired).
		_, _ = again.Exec(ctx)
	}
	return cmds, nil
}

// failedRoundTrip tells a failure of the whole round trip from a per-command reply
// (an error reply or a nil, which stays on its own command).
func failedRoundTrip(err error) bool {
	var re redis.Error
	return err != nil && !errors.As(err, &re)
}
