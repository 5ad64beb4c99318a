package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/internal/storekit"
)

// ErrNotReplicated reports a DONE record that fewer replicas acknowledged than
// WithWaitReplicas asks for; it comes wrapped with ErrStoreUnavailable.
var ErrNotReplicated = errors.New("dedup: DONE not acknowledged by enough replicas")

// replicaWait is the WithWaitReplicas setting of a Store.
type replicaWait struct {
	n          int
	timeout    time.Duration
	shortfalls atomic.Uint64
}

// WithWaitReplicas makes every DONE write (Complete, Mark) wait, by a WAIT in the same
// pipeline, until n replicas have it or timeout passes (default: no wait). A Complete
// that fewer acknowledged fails with ErrNotReplicated (Do reports NotRecorded); a Mark
// keeps its answer, since refusing it would lose the message, and is only counted
// (ReplicaShortfalls). n must be at least 1, timeout at least 1ms and below the
// client's ReadTimeout, and the client not a ClusterClient or Ring.
func WithWaitReplicas(n int, timeout time.Duration) Option {
	return func(s *Store) error {
		if n < 1 {
			return fmt.Errorf("%w: WithWaitReplicas: replicas %d, want at least 1", driver.ErrInvalidOption, n)
		}
		if timeout < time.Millisecond {
			return fmt.Errorf("%w: WithWaitReplicas: timeout %v, want at least 1ms", driver.ErrInvalidOption, timeout)
		}
		switch c := s.c.(type) {
		case *redis.ClusterClient, *redis.Ring:
			return fmt.Errorf("%w: WithWaitReplicas: %T spreads a pipeline over several servers; WAIT needs the connection that wrote", driver.ErrInvalidOption, c)
		case *redis.Client:
			if rt := c.Options().ReadTimeout; rt > 0 && timeout >= rt {
				return fmt.Errorf("%w: WithWaitReplicas: timeout %v is not below the client's ReadTimeout %v", driver.ErrInvalidOption, timeout, rt)
			}
		}
		s.wait = &replicaWait{n: n, timeout: timeout}
		return nil
	}
}

// ReplicaShortfalls returns how many DONE writes fewer replicas acknowledged than
// WithWaitReplicas asks for; 0 without it.
func (s *Store) ReplicaShortfalls() uint64 {
	if s.wait == nil {
		return 0
	}
	return s.wait.shortfalls.Load()
}

// queue adds WAIT to pipe, after the writes it is to cover.
func (w *replicaWait) queue(ctx context.Context, pipe redis.Pipeliner) *redis.IntCmd {
	cmd := redis.NewIntCmd(ctx, "wait", w.n, ms(w.timeout))
	_ = pipe.Process(ctx, cmd) // queued; the reply comes with Exec
	return cmd
}

// acked checks a WAIT reply for one write it covered, counting a shortfall.
func (w *replicaWait) acked(cmd *redis.IntCmd, op string) error {
	got, err := cmd.Result()
	if err != nil {
		w.shortfalls.Add(1)
		return fmt.Errorf("%w: %s: wait for replicas: %w", driver.ErrStoreUnavailable, op, err)
	}
	if got < int64(w.n) {
		w.shortfalls.Add(1)
		return fmt.Errorf("%w: %s: %w: %d of %d within %v", driver.ErrStoreUnavailable, op, ErrNotReplicated, got, w.n, w.timeout)
	}
	return nil
}

// completeManyWaiting is Complete with a WAIT after the writes; NOSCRIPT entries go
// again as EVAL, with a WAIT of their own.
func (s *Store) completeManyWaiting(ctx context.Context, entries []driver.Entry) ([]error, error) {
	out := make([]error, len(entries))
	todo := make([]int, len(entries))
	for i := range todo {
		todo[i] = i
	}
	for eval := false; len(todo) > 0; eval = true {
		pipe := s.c.Pipeline()
		cmds := make([]*redis.Cmd, len(todo))
		args := newBatchArgs(len(todo), 5)
		for j, i := range todo {
			e := entries[i]
			switch {
			case !e.HasReply: // DONE whoever holds the key (Complete)
				cmds[j] = redis.NewCmd(ctx, args.setDone(e)...)
				_ = pipe.Process(ctx, cmds[j])
			case eval:
				cmds[j] = completeScript.Eval(ctx, pipe, []string{e.Key}, completeArgs(e)...)
			default:
				cmds[j] = completeScript.EvalSha(ctx, pipe, []string{e.Key}, completeArgs(e)...)
			}
		}
		wait := s.wait.queue(ctx, pipe)
		if _, err := pipe.Exec(ctx); failedRoundTrip(err) {
			return nil, storekit.StoreErr("complete", err)
		}
		var again []int
		for j, i := range todo {
			err := cmds[j].Err()
			switch {
			case err != nil && !eval && redis.HasErrorPrefix(err, "NOSCRIPT"):
				again = append(again, i)
				continue
			case !entries[i].HasReply && err != nil:
				out[i] = storekit.StoreErr("complete", err)
			case !entries[i].HasReply:
			default:
				out[i] = ownedReply("complete", cmds[j], err)
			}
			if out[i] == nil {
				out[i] = s.wait.acked(wait, "complete")
			}
		}
		todo = again
	}
	return out, nil
}

// markManyWaiting is Mark with a WAIT; an Acquired mark's shortfall is only counted.
func (s *Store) markManyWaiting(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	pipe := s.c.Pipeline()
	cmds, sent := setNXCmds(ctx, storekit.StateDone, entries, true)
	_ = pipe.BatchProcess(ctx, sent...)
	wait := s.wait.queue(ctx, pipe)
	if _, err := pipe.Exec(ctx); failedRoundTrip(err) {
		return nil, storekit.StoreErr("mark", err)
	}
	out := make([]driver.Answer, len(entries))
	for i, c := range cmds {
		var a driver.Answer
		old, err := c.Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			err = storekit.StoreErr("mark", err)
		} else {
			a, err = markAnswer(old, err, entries[i].Token, entries[i].Fingerprint)
		}
		a.Err = err
		if err == nil && a.Status == driver.StatusAcquired {
			_ = s.wait.acked(wait, "mark") // counted; the answer stands
		}
		out[i] = a
	}
	return out, nil
}
