package main

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{10, 10, 1, 1000, 10}, 10},
	} {
		in := slices.Clone(c.in)
		if got := median(in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
		if !slices.Equal(in, c.in) {
			t.Errorf("median reordered its input: %v", in)
		}
	}
	if got := median(nil); !math.IsNaN(got) {
		t.Errorf("median(nil) = %v, want NaN", got)
	}
}

func TestPercentile(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 100; i++ {
		s = append(s, time.Duration(i))
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 50}, {99, 99}, {100, 100}, {1, 1}, {0.5, 1}, {99.5, 100}} {
		if got := percentile(s, c.p); got != c.want {
			t.Errorf("percentile(1..100, %v) = %v, want %v", c.p, got, c.want)
		}
	}
	if got := percentile([]time.Duration{7}, 99); got != 7 {
		t.Errorf("percentile of one sample = %v, want 7", got)
	}
	if got := percentile(nil, 50); got != 0 {
		t.Errorf("percentile of none = %v, want 0", got)
	}
	// merge sorts across workers.
	all := merge([]latencies{{5, 1}, nil, {3, 2, 4}})
	if !slices.Equal(all, []time.Duration{1, 2, 3, 4, 5}) {
		t.Errorf("merge = %v", all)
	}
	if got := percentile(all, 50); got != 3 {
		t.Errorf("p50 of merged = %v, want 3", got)
	}
}

func TestRatio(t *testing.T) {
	if got := ratio(3, 2); got != 1.5 {
		t.Errorf("ratio(3, 2) = %v", got)
	}
	for _, c := range [][2]float64{{0, 1}, {1, 0}, {-1, 1}, {math.NaN(), 1}, {1, math.Inf(1)}} {
		if got := ratio(c[0], c[1]); !math.IsNaN(got) {
			t.Errorf("ratio(%v, %v) = %v, want NaN", c[0], c[1], got)
		}
	}
}

// TestComputeSameRound checks that a ratio pairs values of the same round, takes the
// median of those, skips rounds where a side is missing, and falls back to the
// second denominator only when the first was never measured.
func TestComputeSameRound(t *testing.T) {
	rs := newResults(4)
	// num doubles each round; den follows it, so each same-round ratio is 2 while
	// the ratio of the medians would not be.
	for r, v := range []float64{10, 20, 40, 80} {
		rs.add("s", "num", 0, r, metrics{mOps: 2 * v})
		if r != 1 {
			rs.add("s", "den", 0, r, metrics{mOps: v})
		}
		rs.add("s", "alt", 0, r, metrics{mOps: 1})
	}
	rs.add("s", "other", 0, 0, metrics{mP50: 5})
	def := ratioDef{name: "x", num: []string{"s/num"}, den: []string{"s/missing", "s/other", "s/den", "s/alt"}, metric: mOps, target: 1.5}
	rr, ok := rs.compute(def)
	if !ok {
		t.Fatal("not computed")
	}
	if rr.Den != "s/den" {
		t.Errorf("den %q, want s/den (s/other has no ops, s/missing nothing)", rr.Den)
	}
	if rr.Median != 2 {
		t.Errorf("median %v, want 2", rr.Median)
	}
	if rr.Rounds[1] != nil || rr.Rounds[0] == nil || *rr.Rounds[3] != 2 {
		t.Errorf("rounds %v: want round 2 (index 1) empty, the others 2", rr.Rounds)
	}
	if rr.Met == nil || !*rr.Met || rr.Target != ">= 1.5" {
		t.Errorf("target %q met %v, want >= 1.5 met", rr.Target, rr.Met)
	}
	def.atMost = true
	if rr, _ := rs.compute(def); rr.Met == nil || *rr.Met || rr.Target != "<= 1.5" {
		t.Errorf("at most: target %q met %v, want <= 1.5 not met", rr.Target, rr.Met)
	}
	if _, ok := rs.compute(ratioDef{num: []string{"s/num"}, den: []string{"s/missing"}, metric: mOps}); ok {
		t.Error("computed a ratio with no denominator")
	}
	rs.finish()
	if got := rs.byID["s/den"].Median[mOps]; got != 40 {
		t.Errorf("median of 10, 40, 80 = %v, want 40", got)
	}
}

func TestParseBenchmarkCSV(t *testing.T) {
	out := []byte(`"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
"SET dkbench-x:__rand_int__ v NX PX 60000","870956.50","3.370","1.760","3.287","5.191","5.295","5.351"
`)
	rps, err := parseBenchmarkCSV(out)
	if err != nil || rps != 870956.5 {
		t.Errorf("parse = %v, %v; want 870956.5", rps, err)
	}
	for _, bad := range []string{
		"",
		`"test","rps"` + "\n",
		`"test","x"` + "\n" + `"SET k v","1"` + "\n",
		`"test","rps"` + "\n" + `"GET k","1"` + "\n",
		`"test","rps"` + "\n" + `"SET k v","zero"` + "\n",
		`"test","rps"` + "\n" + `"SET k v","0"` + "\n",
	} {
		if v, err := parseBenchmarkCSV([]byte(bad)); err == nil {
			t.Errorf("parse %q = %v, want an error", bad, v)
		}
	}
}

func TestParseRedisCPU(t *testing.T) {
	info := "# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:2.500000\r\nused_cpu_sys_children:9.0\r\nused_cpu_user_children:9.0\r\n"
	if got, ok := parseRedisCPU(info); !ok || got != 3.75 {
		t.Errorf("parseRedisCPU = %v, %v; want 3.75, true", got, ok)
	}
	for _, bad := range []string{"", "# CPU\r\nused_cpu_sys:1.0\r\n", "used_cpu_sys:x\r\nused_cpu_user:1\r\n"} {
		if got, ok := parseRedisCPU(bad); ok {
			t.Errorf("parseRedisCPU(%q) = %v, true; want false", bad, got)
		}
	}
}

func TestParseRedisIO(t *testing.T) {
	info := "# CPU\r\nused_cpu_sys:1.25\r\n# Stats\r\ntotal_connections_received:7\r\ntotal_commands_processed:5000\r\ntotal_reads_processed:125\r\ntotal_writes_processed:120\r\n"
	if got := parseRedisIO(info); !got.ok || got.cmds != 5000 || got.reads != 125 {
		t.Errorf("parseRedisIO = %+v; want 5000 commands, 125 reads", got)
	}
	for _, bad := range []string{"", "total_commands_processed:5\r\n", "total_commands_processed:5\r\ntotal_reads_processed:x\r\n",
		"total_commands_processed:5\r\ntotal_commands_processed:6\r\n"} {
		if got := parseRedisIO(bad); got.ok {
			t.Errorf("parseRedisIO(%q) = %+v; want not ok", bad, got)
		}
	}
}

func TestParseProcStat(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	stat := "cpu  100 20 30 5000 70 4 6 10 50 0\ncpu0 50 10 15 2500 35 2 3 5 25 0\nintr 1 2 3\n"
	if got, ok := parseProcStat(stat); !ok || got != 1.70 { // (100+20+30+4+6+10) / 100
		t.Errorf("parseProcStat = %v, %v; want 1.70, true", got, ok)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5 6 7 8\n", "cpu  1 2 3 4 5 6 7\n", "cpu  1 2 x 4 5 6 7 8\n"} {
		if got, ok := parseProcStat(bad); ok {
			t.Errorf("parseProcStat(%q) = %v, true; want false", bad, got)
		}
	}
}

// cpuBound: the host's cores over what raw's messages cost the host plus cmds store
// commands at the ceiling's cost (the cheaper Redis, go-redis's client side).
func TestCPUBound(t *testing.T) {
	rs := newResults(2)
	rs.cores = 2
	rs.add("jetstream", "raw-ack", 0, 0, metrics{mOps: 100000, mHostCPU: 10})
	rs.add("ceiling", "redis-benchmark-P64", 0, 0, metrics{mOps: 400000, mRedisCPU: 2})
	rs.add("ceiling", "go-redis-pipeline-P64", 0, 0, metrics{mOps: 300000, mRedisCPU: 3, mClientCPU: 1})
	rs.add("jetstream", "raw-ack", 0, 1, metrics{mOps: 100000, mHostCPU: 10}) // no ceiling in round 2
	for _, c := range []struct {
		cmds int
		want float64
	}{{1, 2e6 / 13 / 100000}, {2, 2e6 / 16 / 100000}} {
		def := ratioDef{name: "b", den: []string{"jetstream/raw-ack"}, metric: mOps, boundCmds: c.cmds}
		rr, ok := rs.compute(def)
		if !ok {
			t.Fatalf("%d commands: not computed", c.cmds)
		}
		if got := *rr.Rounds[0]; math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%d commands: bound %v, want %v", c.cmds, got, c.want)
		}
		if rr.Rounds[1] != nil {
			t.Errorf("%d commands: round 2 has no ceiling, yet a bound %v", c.cmds, *rr.Rounds[1])
		}
	}
}

// atCost: the host's cores over the reference's host CPU per op, over the den's
// rate; none in a round without the reference's figure.
func TestAtCost(t *testing.T) {
	rs := newResults(2)
	rs.cores = 2
	rs.add("ceiling", "redis-benchmark-P64", 0, 0, metrics{mOps: 400000, mRedisCPU: 2})
	rs.add("store", "rueidis-setnx", 64, 0, metrics{mOps: 100000, mHostCPU: 10})
	rs.add("ceiling", "redis-benchmark-P64", 0, 1, metrics{mOps: 400000, mRedisCPU: 2})
	def := ratioDef{name: "b", den: ceilings, metric: mOps, atCostOf: "store/rueidis-setnx/c64"}
	rr, ok := rs.compute(def)
	if !ok {
		t.Fatal("not computed")
	}
	if want := 2e6 / 10 / 400000.0; math.Abs(*rr.Rounds[0]-want) > 1e-9 {
		t.Errorf("ratio %v, want %v", *rr.Rounds[0], want)
	}
	if rr.Rounds[1] != nil {
		t.Errorf("round 2 has no reference, yet a ratio %v", *rr.Rounds[1])
	}
	if !strings.Contains(rr.Num, "rueidis-setnx") {
		t.Errorf("num %q does not name the reference", rr.Num)
	}
}

// TestFigure: a figure is num's own metric in each round, its median checked against
// an absolute target, with no den needed.
func TestFigure(t *testing.T) {
	def := ratioDef{name: "f", num: []string{"local/lru-add"}, metric: mNsOp, target: 400, atMost: true, figure: true}
	for _, tc := range []struct {
		ns  [3]float64
		med float64
		met bool
	}{
		{[3]float64{150, 250, 300}, 250, true},
		{[3]float64{450, 390, 500}, 450, false},
	} {
		rs := newResults(3)
		for r, v := range tc.ns {
			rs.add("local", "lru-add", 0, r, metrics{mNsOp: v})
		}
		rr, ok := rs.compute(def)
		if !ok {
			t.Fatal("not computed")
		}
		if rr.Median != tc.med || rr.Met == nil || *rr.Met != tc.met || rr.Target != "<= 400" {
			t.Errorf("%v: median %v met %v target %q, want %v %v \"<= 400\"", tc.ns, rr.Median, rr.Met, rr.Target, tc.med, tc.met)
		}
		for r, v := range rr.Rounds {
			if v == nil || *v != tc.ns[r] {
				t.Errorf("%v: round %d is %v, want the figure itself", tc.ns, r, v)
			}
		}
	}
	if _, ok := newResults(1).compute(def); ok {
		t.Error("a figure computed with no measurement")
	}
}

// TestRecordForgetsKeys: recording a measurement deletes every key under the run's
// prefix, and no other, so that the next measurement starts on a small keyspace.
func TestRecordForgetsKeys(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { c.Close() })
	b := &bench{prefix: "dkbench-test", plainRDB: c, res: newResults(1)}
	for _, k := range []string{"dkbench-test:filter:k1", "dkbench-test:ceil0:000000000042", "dkbench-test:jsnaive-r0:m1", "other:k"} {
		mr.Set(k, "v")
	}
	if err := b.record(context.Background(), "store", "dedup-filter", 64, 0, metrics{mOps: 1}); err != nil {
		t.Fatal(err)
	}
	if keys := mr.Keys(); len(keys) != 1 || keys[0] != "other:k" {
		t.Errorf("keys after record: %q, want only other:k", keys)
	}
	if !b.res.has("store/dedup-filter/c64", mOps) {
		t.Error("the measurement was not recorded")
	}
}

// TestAddShareIsDisjoint: lru-add's goroutines add disjoint shares of the keys, over
// several laps of the trace, so that no Add refreshes a key another goroutine added
// (walking from offsets, they did: 0.68-0.94 allocations per Add instead of 1).
func TestAddShareIsDisjoint(t *testing.T) {
	for _, procs := range []uint64{1, 2, 4, 8} {
		owner := map[uint64]uint64{}
		for w := range procs {
			for k := range 3 * localKeys / procs {
				i := addShare(w+procs, procs, k) // worker numbers keep growing across reruns
				if o, ok := owner[i]; ok && o != w {
					t.Fatalf("procs %d: key %d added by workers %d and %d", procs, i, o, w)
				}
				owner[i] = w
			}
		}
		if len(owner) != localKeys {
			t.Errorf("procs %d: %d keys added, want all %d", procs, len(owner), localKeys)
		}
	}
}
