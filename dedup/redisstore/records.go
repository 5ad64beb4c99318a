package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/internal/storekit"
	"github.com/dedupkit/dedupkit/keys"
)

var (
	//go:embed scripts/lookup.lua
	lookupLua    string
	lookupScript = redis.NewScript(lookupLua)
	//go:embed scripts/forget.lua
	forgetLua    string
	forgetScript = redis.NewScript(forgetLua)
)

// scanCount is the COUNT of CountRecords' SCAN steps: no step holds the server long.
const scanCount = 1000

// Lookup implements driver.RecordStore: one lookup script (GET and PTTL, atomically)
// per key, in one round trip.
func (s *Store) Lookup(ctx context.Context, keys []string) ([]driver.Record, error) {
	switch len(keys) {
	case 0:
		return nil, nil
	case 1:
		return []driver.Record{s.lookupOne(ctx, keys[0])}, nil
	}
	cmds, err := s.runScriptsVia(ctx, s.exec, lookupScript, lookupLua, storekit.KeyEntries(keys), func(driver.Entry) []any { return nil })
	if err != nil {
		return nil, err
	}
	out := make([]driver.Record, len(keys))
	for i, c := range cmds {
		v, err := c.Result()
		switch {
		case errors.Is(err, redis.Nil): // no record
		case err != nil:
			out[i].Err = storekit.StoreErr("lookup", err)
		default:
			out[i] = lookupReply(v)
		}
	}
	return out, nil
}

// lookupOne looks up one key.
func (s *Store) lookupOne(ctx context.Context, key string) driver.Record {
	cmd, err := s.eval(ctx, lookupScript, lookupLua, key)
	switch {
	case errors.Is(err, redis.Nil):
		return driver.Record{}
	case err != nil:
		return driver.Record{Err: storekit.StoreErr("lookup", err)}
	}
	return lookupReply(cmd.Val())
}

// lookupReply reads the lookup script's {value, pttl}.
func lookupReply(v any) driver.Record {
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		return driver.Record{Err: storekit.StoreErr("lookup", fmt.Errorf("unexpected reply %T", v))}
	}
	val, ok1 := a[0].(string)
	ttl, ok2 := a[1].(int64)
	if !ok1 || !ok2 {
		return driver.Record{Err: storekit.StoreErr("lookup", fmt.Errorf("unexpected reply %v", a))}
	}
	r, err := storekit.RecordOf(val, time.Duration(ttl)*time.Millisecond)
	if err != nil {
		r.Err = storekit.StoreErr("lookup", err)
	}
	return r
}

// Forget implements driver.RecordStore: per key, in one pipeline, the forget script
// deletes the record and publishes its forget notice in one atomic step. It publishes
// for an absent record too, not for one it leaves alone.
func (s *Store) Forget(ctx context.Context, keys []string, force bool) ([]driver.Record, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	for _, k := range keys {
		if _, _, ok := storekit.SplitRecordKey(k); !ok {
			return nil, fmt.Errorf("%w: %q is not a record key (<prefix>:<handler>:<key>)", driver.ErrInvalidOption, k)
		}
	}
	forceArg := "0"
	if force {
		forceArg = "1"
	}
	cmds, err := s.runScripts(ctx, forgetScript, forgetLua, storekit.KeyEntries(keys), func(e driver.Entry) []any {
		channel, k, _ := storekit.SplitRecordKey(e.Key)
		return []any{forceArg, channel, k}
	})
	if err != nil {
		return nil, err
	}
	out := make([]driver.Record, len(keys))
	for i, c := range cmds {
		v, err := c.Result()
		if err != nil {
			out[i].Err = storekit.StoreErr("forget", err)
			continue
		}
		out[i] = forgetReply(v)
	}
	return out, nil
}

// forgetReply reads the forget script's {code, value, pttl, subscribers}.
func forgetReply(v any) driver.Record {
	a, ok := v.([]any)
	if !ok || len(a) != 4 {
		return driver.Record{Err: storekit.StoreErr("forget", fmt.Errorf("unexpected reply %T", v))}
	}
	code, ok1 := a[0].(int64)
	val, ok2 := a[1].(string)
	ttl, ok3 := a[2].(int64)
	n, ok4 := a[3].(int64)
	if !ok1 || !ok2 || !ok3 || !ok4 || code < 0 || code > 2 {
		return driver.Record{Err: storekit.StoreErr("forget", fmt.Errorf("unexpected reply %v", a))}
	}
	if code == 0 {
		return driver.Record{Notified: int(n)}
	}
	r, err := storekit.RecordOf(val, time.Duration(ttl)*time.Millisecond)
	switch {
	case err != nil:
		r.Err = storekit.StoreErr("forget", err)
	case code == 2:
		r.Err = storekit.InProgressErr(r)
	}
	r.Notified = int(n)
	return r
}

// CountRecords implements driver.RecordStore with SCAN on the server, every master of
// a cluster or every shard of a ring.
func (s *Store) CountRecords(ctx context.Context, prefix, handler string) (map[string]int64, error) {
	if err := keys.ValidatePrefix(prefix); err != nil {
		return nil, fmt.Errorf("%w: %w", driver.ErrInvalidOption, err)
	}
	match := prefix + ":*"
	if handler != "" {
		if err := storekit.ValidName(handler); err != nil {
			return nil, err
		}
		match = prefix + ":" + handler + ":*"
	}
	counts := make(map[string]int64)
	var mu sync.Mutex
	scan := func(ctx context.Context, c redis.Cmdable) error {
		local := make(map[string]int64)
		iter := c.Scan(ctx, 0, match, scanCount).Iterator()
		for iter.Next(ctx) {
			if name, ok := storekit.HandlerOf(iter.Val(), prefix); ok {
				local[name]++
			}
		}
		mu.Lock()
		for n, c := range local {
			counts[n] += c
		}
		mu.Unlock()
		return iter.Err()
	}
	var err error
	switch c := s.c.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return scan(ctx, node) })
	case *redis.Ring:
		err = c.ForEachShard(ctx, func(ctx context.Context, shard *redis.Client) error { return scan(ctx, shard) })
	default:
		err = scan(ctx, s.c)
	}
	if err != nil {
		return nil, storekit.StoreErr("count", err)
	}
	return counts, nil
}

// subscribeNotices returns a subscription on a PubSub connection of its own, which
// go-redis redials after a failure; on a cluster it hears notices from every node.
func (s *Store) subscribeNotices() storekit.Sub {
	return &redisNotices{ps: s.c.Subscribe(context.Background())}
}

// noticeSubscribers is PUBSUB NUMSUB, summed over every master or shard.
func (s *Store) noticeSubscribers(ctx context.Context, channel string) (int64, error) {
	var mu sync.Mutex
	var total int64
	count := func(ctx context.Context, c redis.Cmdable) error {
		m, err := c.PubSubNumSub(ctx, channel).Result()
		mu.Lock()
		total += m[channel]
		mu.Unlock()
		return err
	}
	var err error
	switch c := s.c.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return count(ctx, node) })
	case *redis.Ring:
		err = c.ForEachShard(ctx, func(ctx context.Context, shard *redis.Client) error { return count(ctx, shard) })
	default:
		err = count(ctx, s.c)
	}
	if err != nil {
		return 0, storekit.StoreErr("subscribers", err)
	}
	return total, nil
}

// redisNotices is a storekit.Sub over a go-redis PubSub, whose reads do not hold its
// lock: Add and Close may run while Receive waits.
type redisNotices struct{ ps *redis.PubSub }

func (r *redisNotices) Add(ctx context.Context, channels ...string) error {
	// on a failure go-redis keeps the channels, for its next connection
	return r.ps.Subscribe(ctx, channels...)
}

func (r *redisNotices) Receive(ctx context.Context, timeout time.Duration) (storekit.Notice, error) {
	m, err := r.ps.ReceiveTimeout(ctx, timeout)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return storekit.Notice{}, storekit.ErrNoNotice
		}
		var refused redis.Error
		if errors.As(err, &refused) { // the server refused a SUBSCRIBE or PING (an ACL)
			return storekit.Notice{}, &storekit.Refused{Err: err}
		}
		return storekit.Notice{}, err
	}
	switch m := m.(type) {
	case *redis.Subscription:
		if m.Kind == "subscribe" {
			return storekit.Notice{Kind: storekit.Subscribed, Channel: m.Channel}, nil
		}
	case *redis.Message:
		return storekit.Notice{Kind: storekit.Forgotten, Channel: m.Channel, K: m.Payload}, nil
	}
	return storekit.Notice{Kind: storekit.Heard}, nil // a PONG, or a reply of no interest: the line is alive
}

func (r *redisNotices) Ping(ctx context.Context) error { return r.ps.Ping(ctx) }
func (r *redisNotices) InProcess() bool                { return false }

func (r *redisNotices) Close() error { return r.ps.Close() }

// ForgetNotices returns the store's forget-notice transport, for dedup's use.
func (s *Store) ForgetNotices() storekit.Bus { return notices{s} }

type notices struct{ s *Store }

func (n notices) Subscribe() storekit.Sub { return n.s.subscribeNotices() }
func (n notices) Subscribers(ctx context.Context, channel string) (int64, error) {
	return n.s.noticeSubscribers(ctx, channel)
}
