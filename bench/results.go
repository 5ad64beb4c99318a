package main

import (
	"fmt"
	"math"
	"runtime"
)

// Metric names: the keys of a metrics map and of the JSON.
const (
	mOps      = "ops_per_sec"     // operations (messages) per second
	mP50      = "p50_ns"          // median latency of one operation
	mP99      = "p99_ns"          // 99th percentile latency
	mNsOp     = "ns_per_op"       // testing.Benchmark's time per operation (all goroutines)
	mAllocs   = "allocs_per_op"   // heap allocations per operation
	mLocalHit = "local_hit_ratio" // share of checks answered by the local tier
	mDupRatio = "dup_ratio"       // share of checks answered "duplicate", by any tier
)

// metrics is one measurement: metric name → value.
type metrics map[string]float64

// series is one variant of one scenario measured once per round.
type series struct {
	Scenario    string `json:"scenario"`
	Variant     string `json:"variant"`
	Concurrency int    `json:"concurrency,omitempty"`
	// Rounds holds one measurement per round; null where the variant did not run.
	Rounds []metrics `json:"rounds"`
	// Median holds each metric's median over the rounds that measured it.
	Median metrics `json:"median"`
}

// seriesID names a series: scenario/variant, and /c<n> for a concurrency.
func seriesID(scenario, variant string, conc int) string {
	if conc == 0 {
		return scenario + "/" + variant
	}
	return fmt.Sprintf("%s/%s/c%d", scenario, variant, conc)
}

// results collects the measurements of a run.
type results struct {
	rounds int
	cores  int      // the host's CPUs, for cpuBound
	order  []string // series ids, first measured first
	byID   map[string]*series
}

func newResults(rounds int) *results {
	return &results{rounds: rounds, cores: runtime.NumCPU(), byID: map[string]*series{}}
}

// add records the measurement of round r.
func (rs *results) add(scenario, variant string, conc, r int, m metrics) {
	id := seriesID(scenario, variant, conc)
	s := rs.byID[id]
	if s == nil {
		s = &series{Scenario: scenario, Variant: variant, Concurrency: conc, Rounds: make([]metrics, rs.rounds)}
		rs.byID[id] = s
		rs.order = append(rs.order, id)
	}
	s.Rounds[r] = m
}

// get returns metric of series id in round r, or NaN when it was not measured.
func (rs *results) get(id, metric string, r int) float64 {
	s := rs.byID[id]
	if s == nil || s.Rounds[r] == nil {
		return math.NaN()
	}
	v, ok := s.Rounds[r][metric]
	if !ok {
		return math.NaN()
	}
	return v
}

// has reports whether series id measured metric in any round.
func (rs *results) has(id, metric string) bool {
	for r := range rs.rounds {
		if !math.IsNaN(rs.get(id, metric, r)) {
			return true
		}
	}
	return false
}

// finish computes every series' medians.
func (rs *results) finish() {
	for _, id := range rs.order {
		s := rs.byID[id]
		vals := map[string][]float64{}
		for _, m := range s.Rounds {
			for k, v := range m {
				vals[k] = append(vals[k], v)
			}
		}
		s.Median = metrics{}
		for k, vs := range vals {
			s.Median[k] = median(vs)
		}
	}
}

// ratioDef is a figure of merit: num's metric over den's, taken within each round.
// num and den list alternatives: the first series that measured the metric in any
// round is used (the ceiling is redis-benchmark when it ran, else go-redis pipelines).
type ratioDef struct {
	name     string
	num, den []string
	metric   string
	target   float64 // 0: none
	atMost   bool    // the target is a maximum, else a minimum
	required bool    // issue 22 requires it in the JSON (with issue 4's that were met)
	// reference marks issue 4's ratios and targets, which issue 22 re-scoped: shown,
	// and judged, but no longer goals
	reference bool
	// boundCmds, when above 0, makes this a CPU bound (cpuBound) over den for a
	// variant that sends that many store commands per message; num is then unused.
	boundCmds int
	// atCostOf, when set, makes this the rate the host's CPUs allow (atCost) over den
	// for a variant that costs the host what the series atCostOf costs per op; num is
	// then unused.
	atCostOf string
	// figure makes this num's metric itself, not a ratio: a figure with an absolute
	// target (the local tier's insert cost, issue 4 §3). den is then unused.
	figure bool
}

// ratioDefs are the ratios of a run, required ones first: issue 28's figures with
// their targets, then issue 22's and issue 4's kept as references.
var ratioDefs = []ratioDef{
	{name: "jetstream_do_vs_raw", num: []string{"jetstream/dedup-do"}, den: []string{"jetstream/raw-ack"}, metric: mOps, target: 0.55, required: true},
	{name: "jetstream_filter_vs_raw", num: []string{"jetstream/dedup-filter"}, den: []string{"jetstream/raw-ack"}, metric: mOps, target: 0.80, required: true},
	{name: "jetstream_filter_vs_handpipelined", num: []string{"jetstream/dedup-filter"}, den: []string{"jetstream/" + varHandPipelined}, metric: mOps, target: 1.0, required: true},
	{name: "jetstream_do_redis_us", num: []string{"jetstream/dedup-do"}, metric: mRedisCPU, target: 4.5, atMost: true, figure: true, required: true},
	{name: "jetstream_do_client_us", num: []string{"jetstream/dedup-do"}, metric: mClientCPU, target: 6, atMost: true, figure: true, required: true},
	{name: "store_do_c64_vs_naive", num: []string{"store/dedup-do/c64"}, den: []string{"store/naive-setnx/c64"}, metric: mOps, target: 1.0, required: true},
	{name: "store_do_c64_vs_rueidis_setnx_setxx", num: []string{"store/dedup-do/c64"}, den: []string{"store/rueidis-setnx-setxx/c64"}, metric: mOps, target: 1.2, required: true},
	{name: "store_filter_c64_vs_goredis_auto", num: []string{"store/dedup-filter/c64"}, den: []string{"store/goredis-auto-setnx/c64"}, metric: mOps, target: 1.0, required: true},
	{name: "store_markmany_vs_ceiling", num: []string{"store/" + varMarkMany + "/c4"}, den: ceilings, metric: mOps, target: 0.80, required: true},
	{name: "local_hit_vs_syncmap", num: []string{"local/lru-contains"}, den: []string{"local/syncmap-load"}, metric: mNsOp, target: 1.5, atMost: true, required: true},
	{name: "c1_p50_vs_direct", num: []string{"latency/dedup-mark/c1"}, den: []string{"latency/direct-set-nx/c1"}, metric: mP50, target: 1.10, atMost: true, required: true},
	// issue 27 point 4: the store's own auto-pipeliner went (the Deduper's batcher
	// merges the calls); this is dedup over a plain client against dedup over
	// go-redis's AutoPipeline, which a user may hand the store instead
	{name: "store_filter_c64_ours_vs_goredis_ap", num: []string{"store/dedup-filter/c64"}, den: []string{"store/" + varFilterGoAP + "/c64"}, metric: mOps},
	{name: "store_do_c64_ours_vs_goredis_ap", num: []string{"store/dedup-do/c64"}, den: []string{"store/" + varDoGoAP + "/c64"}, metric: mOps},
	// issue 22's targets that issue 28 re-scoped to the bounds measured on Redis 7.0
	// (two plain SETs and their I/O are 4.3 µs; go-redis's own pipeline is the client
	// floor): kept for reference
	{name: "jetstream_do_redis_us_issue22", num: []string{"jetstream/dedup-do"}, metric: mRedisCPU, target: 3.5, atMost: true, figure: true, reference: true},
	{name: "store_do_c64_vs_rueidis_setnx_setxx_issue22", num: []string{"store/dedup-do/c64"}, den: []string{"store/rueidis-setnx-setxx/c64"}, metric: mOps, target: 1.5, reference: true},
	{name: "store_filter_c64_vs_goredis_auto_issue22", num: []string{"store/dedup-filter/c64"}, den: []string{"store/goredis-auto-setnx/c64"}, metric: mOps, target: 1.25, reference: true},
	// issue 4's ratios and targets, which issue 22 re-scoped: kept for reference
	{name: "store_filter_c64_vs_ceiling", num: []string{"store/dedup-filter/c64"}, den: ceilings, metric: mOps, target: 0.75, reference: true},
	{name: "store_do_c64_vs_ceiling", num: []string{"store/dedup-do/c64"}, den: ceilings, metric: mOps, target: 0.40, reference: true},
	{name: "store_filter_c64_vs_naive", num: []string{"store/dedup-filter/c64"}, den: []string{"store/naive-setnx/c64"}, metric: mOps, target: 4, reference: true},
	{name: "jetstream_filter_vs_raw_issue4", num: []string{"jetstream/dedup-filter"}, den: []string{"jetstream/raw-ack"}, metric: mOps, target: 0.90, reference: true},
	{name: "jetstream_do_vs_raw_issue4", num: []string{"jetstream/dedup-do"}, den: []string{"jetstream/raw-ack"}, metric: mOps, target: 0.80, reference: true},
	{name: "local_insert_ns", num: []string{"local/lru-add"}, metric: mNsOp, target: 400, atMost: true, figure: true},
	{name: "mark_local_hit_vs_syncmap", num: []string{"local/mark-local-hit"}, den: []string{"local/syncmap-load"}, metric: mNsOp, atMost: true},
	{name: "store_filter_c64_vs_go_pipeline", num: []string{"store/dedup-filter/c64"}, den: []string{ceilingGo}, metric: mOps},
	{name: "zipf_filter_vs_naive", num: []string{"zipf/dedup-filter/c64"}, den: []string{"zipf/naive-setnx/c64"}, metric: mOps},
	{name: "jetstream_filter_nolocal_vs_handpipelined", num: []string{"jetstream/" + varFilterNoLocal}, den: []string{"jetstream/" + varHandPipelined}, metric: mOps},
	{name: "jetstream_naive_vs_raw", num: []string{"jetstream/naive-setnx"}, den: []string{"jetstream/raw-ack"}, metric: mOps},
	{name: "rueidis_c64_vs_ceiling", num: []string{"store/rueidis-setnx/c64"}, den: ceilings, metric: mOps},
	{name: "store_filter_c64_vs_rueidis", num: []string{"store/dedup-filter/c64"}, den: []string{"store/rueidis-setnx/c64"}, metric: mOps},
	{name: "rueidis_setnx_setxx_c64_vs_ceiling", num: []string{"store/rueidis-setnx-setxx/c64"}, den: ceilings, metric: mOps},
	{name: "goredis_auto_c64_vs_ceiling", num: []string{"store/goredis-auto-setnx/c64"}, den: ceilings, metric: mOps},
	{name: "store_filter_c64_vs_ceiling_at_rueidis_cost", den: ceilings, metric: mOps, atCostOf: "store/rueidis-setnx/c64"},
	{name: "store_do_c64_vs_ceiling_at_rueidis_cost", den: ceilings, metric: mOps, atCostOf: "store/rueidis-setnx-setxx/c64"},
	{name: "jetstream_filter_vs_raw_cpu_bound", den: []string{"jetstream/raw-ack"}, metric: mOps, boundCmds: 1},
	{name: "jetstream_do_vs_raw_cpu_bound", den: []string{"jetstream/raw-ack"}, metric: mOps, boundCmds: 2},
	// issue 19 §5: the transactional marker against PostgreSQL (scenario e)
	{name: "tx_marker_vs_plain_tx", num: []string{"tx/dedup-tx"}, den: []string{"tx/plain-tx"}, metric: mOps, target: 0.65},
	{name: "tx_marker_vs_marker_only", num: []string{"tx/dedup-tx"}, den: []string{"tx/marker-only"}, metric: mOps, target: 0.90},
	{name: "tx_duplicate_vs_marker_only_duplicate", num: []string{"tx/dup-dedup"}, den: []string{"tx/dup-marker-only"}, metric: mOps, target: 10},
	{name: "tx_batch64_vs_tx_single", num: []string{"tx/dedup-tx-batch64"}, den: []string{"tx/dedup-tx"}, metric: mOps, target: 5},
	{name: "tx_store_duplicate_vs_marker_only_duplicate", num: []string{"tx/dup-dedup-store"}, den: []string{"tx/dup-marker-only"}, metric: mOps},
	{name: "tx_marker_only_vs_plain_tx", num: []string{"tx/marker-only"}, den: []string{"tx/plain-tx"}, metric: mOps},
}

// The two ceilings, the preferred first.
const (
	ceilingRedisBenchmark = "ceiling/redis-benchmark-P64"
	ceilingGo             = "ceiling/go-redis-pipeline-P64"
)

var ceilings = []string{ceilingRedisBenchmark, ceilingGo}

// ratio is a computed ratioDef.
type ratioResult struct {
	Num    string `json:"num"`
	Den    string `json:"den"`
	Metric string `json:"metric"`
	// Rounds is num/den within each round; null where either was not measured.
	Rounds []*float64 `json:"rounds"`
	Median float64    `json:"median"`
	Target string     `json:"target,omitempty"` // e.g. ">= 0.75"
	Met    *bool      `json:"met,omitempty"`
	// Reference: an earlier issue's target (4 or 22), kept for reference
	Reference bool `json:"reference,omitempty"`
}

// compute returns def's ratio, or false when no round measured both sides.
func (rs *results) compute(def ratioDef) (ratioResult, bool) {
	pick := func(ids []string) string {
		for _, id := range ids {
			if rs.has(id, def.metric) {
				return id
			}
		}
		return ""
	}
	num, den := pick(def.num), pick(def.den)
	switch {
	case def.boundCmds > 0:
		num = fmt.Sprintf("cpu bound (%d store command(s) per message)", def.boundCmds)
	case def.atCostOf != "":
		num = fmt.Sprintf("cores over the host CPU per op of %s", def.atCostOf)
	case def.figure:
		den = "-"
	}
	if num == "" || den == "" {
		return ratioResult{}, false
	}
	out := ratioResult{Num: num, Den: den, Metric: def.metric, Rounds: make([]*float64, rs.rounds)}
	var vals []float64
	for r := range rs.rounds {
		var v float64
		switch {
		case def.boundCmds > 0:
			v = rs.cpuBound(den, def.boundCmds, r)
		case def.atCostOf != "":
			v = rs.atCost(def.atCostOf, den, r)
		case def.figure:
			v = rs.get(num, def.metric, r)
		default:
			v = ratio(rs.get(num, def.metric, r), rs.get(den, def.metric, r))
		}
		if !math.IsNaN(v) {
			out.Rounds[r] = &v
			vals = append(vals, v)
		}
	}
	if len(vals) == 0 {
		return ratioResult{}, false
	}
	out.Median = median(vals)
	if def.target > 0 {
		met := out.Median >= def.target
		out.Target = fmt.Sprintf(">= %g", def.target)
		if def.atMost {
			met = out.Median <= def.target
			out.Target = fmt.Sprintf("<= %g", def.target)
		}
		out.Met = &met
		out.Reference = def.reference
	}
	return out, true
}

// atCost is the most that CPU lets a variant reach against den in round r, if each of
// its ops cost the whole host (host_cpu_us_per_op) what one of ref's did: with every
// core busy its rate is then at most cores / ref's host µs, over den's rate. ref is a
// reference client sending only what a check must send (scenario b's rueidis
// variants), so this says what the host allows a client with one goroutine per call
// that is exactly as cheap as that one. It is not a bound on dedup: a client cheaper
// per call goes above it. It is NaN when the round lacks a figure.
func (rs *results) atCost(ref, den string, r int) float64 {
	return ratio(float64(rs.cores)*1e6/rs.get(ref, mHostCPU, r), rs.get(den, mOps, r))
}

// cpuBound is the most that CPU lets a variant reach against den (a JetStream
// variant) in round r, if the variant sends cmds store commands per message. Every
// message costs the whole host at least what den's did (host_cpu_us_per_op: this
// process, nats-server, the rest), and each store command at least what a SET NX PX
// costs at the ceiling: Redis's CPU per SET in 64-deep pipelines (the lower of
// redis-benchmark's and go-redis's) plus the client's in go-redis's own 64-deep
// pipelines. With the host's cores all busy, the variant's rate is then at most
//
//	cores / (den's host µs + cmds × (Redis µs + client µs))
//
// and the bound is that over den's rate. It is NaN when the round lacks a figure
// (scenario b did not run, or no real Redis, or no /proc/stat).
func (rs *results) cpuBound(den string, cmds, r int) float64 {
	host, ops := rs.get(den, mHostCPU, r), rs.get(den, mOps, r)
	redisMin := math.NaN()
	for _, c := range ceilings {
		if v := rs.get(c, mRedisCPU, r); !math.IsNaN(v) && !(v >= redisMin) {
			redisMin = v
		}
	}
	client := rs.get(ceilingGo, mClientCPU, r)
	perMsg := host + float64(cmds)*(redisMin+client)
	return ratio(float64(rs.cores)*1e6/perMsg, ops)
}
