package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/driver"
)

// Scenario b: unique keys through Redis.
//
// At each concurrency c, c goroutines check a new key per call, in a loop, for the
// measurement's duration: dedup in filter mode (Handler.Mark), dedup in Do mode
// (Handler.Do with an empty fn), and the naive way, one go-redis SetNX per key.
// Beside them, the same goroutines on rueidis, a Go client built around automatic
// pipelining, sending only what a check must at least send: one SET NX PX per call
// (the floor for filter mode), and SET NX PX then SET XX PX (two round trips, as a
// Do's claim and completion, without the completion's script). They say what a Go
// client with one goroutine per call reaches on the machine, beside the ceiling.
// And the naive way's SetNX (SET NX EX) through go-redis's own automatic pipelining
// (Client.AutoPipeline, experimental in go-redis v9.23), which is what a user of
// go-redis would reach for before dedup's.
// Once per round, the ceiling: redis-benchmark -P 64 (50 connections, 64 commands in
// flight on each) sending SET NX PX, and the same shape from go-redis pipelines.
// Then the latency of one Mark against the SET NX PX it sends for a new key, issued
// directly, alternating one of each at concurrency 1.

// Pipeline depth and connections of both ceilings: redis-benchmark's -P 64 and its
// default of 50 clients.
const (
	ceilingDepth   = 64
	ceilingClients = 50
)

// Store variants of scenario b.
const (
	varFilter   = "dedup-filter"
	varDo       = "dedup-do"
	varNaive    = "naive-setnx"
	varRueidis  = "rueidis-setnx"       // one SET NX PX per call, on rueidis
	varRueidis2 = "rueidis-setnx-setxx" // SET NX PX, then SET XX PX, on rueidis
	varGoAuto   = "goredis-auto-setnx"  // one SetNX per call, through go-redis's AutoPipeline
	// dedup-filter and dedup-do on the same store code over go-redis's AutoPipeline
	// instead of a plain client (issue 27 point 4)
	varFilterGoAP = "dedup-filter-goredis-ap"
	varDoGoAP     = "dedup-do-goredis-ap"
	// varMarkMany is the store's Mark of markManyKeys new keys per call from
	// markManyConc goroutines (issue 22: the batch path against the ceiling); its
	// rate is in keys.
	varMarkMany  = "dedup-markmany64"
	markManyKeys = 64
	markManyConc = 4
)

// storeVariants are scenario b's, in the order of the report.
var storeVariants = []string{varFilter, varDo, varFilterGoAP, varDoGoAP, varNaive, varRueidis, varRueidis2, varGoAuto}

// noop is the handler fn of Do: the bench measures what dedup costs, not work.
func noop(context.Context) error { return nil }

// storeState is what scenario b keeps across rounds.
type storeState struct {
	filter, do         *dedup.Handler
	filterGoAP, doGoAP *dedup.Handler // the same over go-redis's AutoPipeline
	redisBench         string         // redis-benchmark's path; empty when the ceiling is skipped
}

func (b *bench) setupStore(ctx context.Context) error {
	var err error
	st := &b.store
	if st.filter, err = b.dd.Register("filter", dedup.WithMode(dedup.ModeFilter), dedup.WithRetention(retention)); err != nil {
		return err
	}
	if st.do, err = b.dd.Register("do", dedup.WithMode(dedup.ModeDo), dedup.WithRetention(retention)); err != nil {
		return err
	}
	if st.filterGoAP, err = b.ddGoAuto.Register("filter-goap", dedup.WithMode(dedup.ModeFilter), dedup.WithRetention(retention)); err != nil {
		return err
	}
	if st.doGoAP, err = b.ddGoAuto.Register("do-goap", dedup.WithMode(dedup.ModeDo), dedup.WithRetention(retention)); err != nil {
		return err
	}
	switch path, lerr := exec.LookPath("redis-benchmark"); {
	case b.srv.redisEmbedded:
		b.note("ceiling: redis-benchmark skipped: the server is miniredis; ratios to the ceiling use go-redis pipelines of %d instead", ceilingDepth)
	case lerr != nil:
		b.note("ceiling: redis-benchmark skipped: not on PATH; ratios to the ceiling use go-redis pipelines of %d instead", ceilingDepth)
	default:
		st.redisBench = path
	}
	// Warm up: connections in both pools, the Do scripts loaded on the server.
	warm := min(b.cfg.duration/5, 200*time.Millisecond)
	top := slices.Max(b.cfg.concurrency)
	for _, v := range storeVariants {
		if _, err := load(ctx, top, warm, b.storeOp(v, keyMaker{head: "warm-" + v + "-"})); err != nil {
			return fmt.Errorf("warm-up %s: %w", v, err)
		}
	}
	return b.forget(ctx)
}

// storeOp returns variant's operation on the new keys of km.
func (b *bench) storeOp(variant string, km keyMaker) op {
	switch variant {
	case varFilter, varFilterGoAP:
		h := b.store.filter
		if variant == varFilterGoAP {
			h = b.store.filterGoAP
		}
		return func(ctx context.Context, w, i int) error {
			res, err := h.Mark(ctx, km.key(w, i))
			if err == nil && res.Outcome != dedup.First {
				err = fmt.Errorf("mark of a new key answered %v", res.Outcome)
			}
			return err
		}
	case varDo, varDoGoAP:
		h := b.store.do
		if variant == varDoGoAP {
			h = b.store.doGoAP
		}
		return func(ctx context.Context, w, i int) error {
			res, err := h.Do(ctx, km.key(w, i), noop)
			if err == nil && res.Outcome != dedup.Processed {
				err = fmt.Errorf("do of a new key answered %v", res.Outcome)
			}
			return err
		}
	case varRueidis, varRueidis2:
		head := b.prefix + ":rueidis:"
		return func(ctx context.Context, w, i int) error {
			k := head + km.key(w, i)
			err := b.rue.Do(ctx, b.rue.B().Set().Key(k).Value("1").Nx().PxMilliseconds(retention.Milliseconds()).Build()).Error()
			if rueidis.IsRedisNil(err) {
				err = errors.New("SET NX of a new key found it set")
			}
			if err == nil && variant == varRueidis2 {
				err = b.rue.Do(ctx, b.rue.B().Set().Key(k).Value("2").Xx().PxMilliseconds(retention.Milliseconds()).Build()).Error()
				if rueidis.IsRedisNil(err) {
					err = errors.New("SET XX of a key just set found it gone")
				}
			}
			return err
		}
	case varGoAuto:
		return setNXOp(b.goAuto, b.prefix+":goauto:", km)
	default:
		return setNXOp(b.plainRDB, b.prefix+":naive:", km)
	}
}

// setNXOp is one SetNX per call on c (the naive way, or go-redis's AutoPipeline) of
// the new keys of km under head.
func setNXOp(c interface {
	SetNX(ctx context.Context, key string, value any, expiration time.Duration) *redis.BoolCmd
}, head string, km keyMaker) op {
	return func(ctx context.Context, w, i int) error {
		ok, err := c.SetNX(ctx, head+km.key(w, i), 1, retention).Result()
		if err == nil && !ok {
			err = errors.New("SETNX of a new key found it set")
		}
		return err
	}
}

func (b *bench) roundStore(ctx context.Context, r int) error {
	if b.store.redisBench != "" {
		meter := b.startCPU(ctx)
		rps, err := b.redisBenchmark(ctx, r)
		if err != nil {
			return fmt.Errorf("redis-benchmark: %w", err)
		}
		use := meter.stop(ctx)
		use.clientOK = false // the client is redis-benchmark, not this process
		m := metrics{mOps: rps}
		use.addTo(m)
		if err := b.record(ctx, "ceiling", "redis-benchmark-P64", 0, r, m); err != nil {
			return err
		}
	}
	m, err := b.goPipelineCeiling(ctx, r)
	if err != nil {
		return fmt.Errorf("go-redis pipeline ceiling: %w", err)
	}
	if err := b.record(ctx, "ceiling", "go-redis-pipeline-P64", 0, r, m); err != nil {
		return err
	}
	if err := b.pairedLatency(ctx, r); err != nil {
		return fmt.Errorf("latency at concurrency 1: %w", err)
	}
	if err := b.markMany(ctx, r); err != nil {
		return fmt.Errorf("%s: %w", varMarkMany, err)
	}
	variants := storeVariants
	for _, c := range b.cfg.concurrency {
		// Each round starts with another variant, so none always runs first.
		for j := range variants {
			v := variants[(j+r)%len(variants)]
			km := keyMaker{head: fmt.Sprintf("r%d-c%d-%s-", r, c, v)}
			meter := b.startCPU(ctx)
			var m metrics
			var err error
			pprof.Do(ctx, pprof.Labels("scenario", "store", "variant", v, "concurrency", strconv.Itoa(c)), func(ctx context.Context) {
				m, err = load(ctx, c, b.cfg.duration, b.storeOp(v, km))
			})
			if err != nil {
				return fmt.Errorf("%s at concurrency %d: %w", v, c, err)
			}
			meter.stop(ctx).addTo(m)
			if err := b.record(ctx, "store", v, c, r, m); err != nil {
				return err
			}
		}
	}
	return nil
}

// redisBenchmark runs redis-benchmark against the server (SET NX PX on random keys
// under the run's prefix) and returns its requests per second.
func (b *bench) redisBenchmark(ctx context.Context, r int) (float64, error) {
	host, port, err := net.SplitHostPort(b.srv.redisAddr)
	if err != nil {
		return 0, err
	}
	key := fmt.Sprintf("%s:ceil%d:__rand_int__", b.prefix, r)
	cmd := exec.CommandContext(ctx, b.store.redisBench, "-h", host, "-p", port,
		"-P", strconv.Itoa(ceilingDepth), "-c", strconv.Itoa(ceilingClients),
		"-n", strconv.Itoa(b.cfg.ceilingRequests), "-r", "100000000", "-q", "--csv",
		"SET", key, "v", "NX", "PX", "60000")
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, bytes.TrimSpace(ee.Stderr))
		}
		return 0, err
	}
	return parseBenchmarkCSV(out)
}

// parseBenchmarkCSV reads the rps of the SET test from redis-benchmark --csv output.
func parseBenchmarkCSV(out []byte) (float64, error) {
	rd := csv.NewReader(bytes.NewReader(out))
	rd.FieldsPerRecord = -1
	recs, err := rd.ReadAll()
	if err != nil {
		return 0, fmt.Errorf("parse redis-benchmark output: %w", err)
	}
	if len(recs) < 2 {
		return 0, fmt.Errorf("redis-benchmark output has no result: %q", out)
	}
	col := slices.Index(recs[0], "rps")
	if col < 0 {
		return 0, fmt.Errorf("redis-benchmark output has no rps column: %q", recs[0])
	}
	for _, rec := range recs[1:] {
		if len(rec) > col && strings.HasPrefix(rec[0], "SET") {
			rps, err := strconv.ParseFloat(rec[col], 64)
			if err != nil || !positive(rps) {
				return 0, fmt.Errorf("redis-benchmark rps %q is not a positive number", rec[col])
			}
			return rps, nil
		}
	}
	return 0, fmt.Errorf("redis-benchmark output has no SET row: %q", out)
}

// goPipelineCeiling is redis-benchmark's shape in go-redis: ceilingClients goroutines
// each sending pipelines of ceilingDepth SET NX PX on new keys.
func (b *bench) goPipelineCeiling(ctx context.Context, r int) (metrics, error) {
	km := keyMaker{head: fmt.Sprintf("%s:pipe%d-", b.prefix, r)}
	args := redis.SetArgs{Mode: "NX", TTL: time.Minute}
	meter := b.startCPU(ctx)
	m, err := load(ctx, ceilingClients, b.cfg.duration, func(ctx context.Context, w, i int) error {
		pipe := b.plainRDB.Pipeline()
		for j := range ceilingDepth {
			pipe.SetArgs(ctx, km.key(w, i*ceilingDepth+j), "v", args)
		}
		_, err := pipe.Exec(ctx)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := metrics{mOps: m[mOps] * ceilingDepth}
	meter.stop(ctx).addTo(out)
	return out, nil
}

// pairedLatency times Mark on a new key and, alternately before and after it, the
// command Mark sends for one (SET key value NX PX retention) sent directly with go-redis,
// one at a time for the measurement's duration. Keys are built before the clock
// starts for both; what Mark does to build its record key is part of its cost.
func (b *bench) pairedLatency(ctx context.Context, r int) error {
	km := keyMaker{head: fmt.Sprintf("lat%d-", r)}
	directHead := b.prefix + ":direct:"
	value := strings.Repeat("v", 32) // about a record's length
	args := redis.SetArgs{Mode: "NX", TTL: retention}
	var ours, direct latencies
	mark := func(k string) error {
		t0 := time.Now()
		res, err := b.store.filter.Mark(ctx, k)
		ours = append(ours, time.Since(t0))
		if err == nil && res.Outcome != dedup.First {
			err = fmt.Errorf("mark of a new key answered %v", res.Outcome)
		}
		return err
	}
	set := func(k string) error {
		t0 := time.Now()
		err := b.plainRDB.SetArgs(ctx, k, value, args).Err()
		direct = append(direct, time.Since(t0))
		if errors.Is(err, redis.Nil) {
			err = errors.New("SET NX of a new key found a value")
		}
		return err
	}
	deadline := time.Now().Add(b.cfg.duration)
	for i := 0; time.Now().Before(deadline); i++ {
		k := km.key(0, i)
		dk := directHead + k
		first, second := func() error { return mark(k) }, func() error { return set(dk) }
		if i%2 == 1 {
			first, second = second, first
		}
		if err := errors.Join(first(), second()); err != nil {
			return err
		}
	}
	for _, p := range []struct {
		variant string
		l       latencies
	}{{varMark, ours}, {varDirect, direct}} {
		s := merge([]latencies{p.l})
		b.res.add("latency", p.variant, 1, r, metrics{mP50: float64(percentile(s, 50)), mP99: float64(percentile(s, 99))})
	}
	return b.forget(ctx)
}

// Variants of the latency pair.
const (
	varMark   = "dedup-mark"
	varDirect = "direct-set-nx"
)

// markMany measures varMarkMany: markManyConc goroutines each sending a Mark of
// markManyKeys new keys per call to the Redis store, as a batch path does; the rate
// is keys per second.
func (b *bench) markMany(ctx context.Context, r int) error {
	store := b.dd.Store()
	km := keyMaker{head: fmt.Sprintf("%s:mm-r%d-", b.prefix, r)}
	op := func(ctx context.Context, w, i int) error {
		entries := make([]driver.Entry, markManyKeys)
		for j := range entries {
			entries[j] = driver.Entry{Key: km.key(w, i*markManyKeys+j), Token: "t", TTL: retention}
		}
		answers, err := store.Mark(ctx, entries)
		if err != nil {
			return err
		}
		for _, a := range answers {
			if a.Err != nil || a.Status != driver.StatusAcquired {
				return fmt.Errorf("a Mark of %d new keys answered %v %v", markManyKeys, a.Status, a.Err)
			}
		}
		return nil
	}
	meter := b.startCPU(ctx)
	var m metrics
	var err error
	pprof.Do(ctx, pprof.Labels("scenario", "store", "variant", varMarkMany, "concurrency", strconv.Itoa(markManyConc)), func(ctx context.Context) {
		m, err = load(ctx, markManyConc, b.cfg.duration, op)
	})
	if err != nil {
		return err
	}
	m[mOps] *= markManyKeys // keys, not calls; the latencies are a call's
	meter.stop(ctx).addTo(m)
	return b.record(ctx, "store", varMarkMany, markManyConc, r, m)
}
