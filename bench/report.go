package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// report prints the tables and the ratios, and writes -json and -svg.
func (b *bench) report() error {
	b.res.finish()
	ratios := map[string]float64{}
	details := map[string]ratioResult{}
	var missing []string
	for _, def := range ratioDefs {
		rr, ok := b.res.compute(def)
		if !ok {
			if def.required {
				missing = append(missing, def.name)
			}
			continue
		}
		ratios[def.name] = rr.Median
		details[def.name] = rr
	}

	fmt.Fprintln(b.out)
	for _, n := range b.notes {
		fmt.Fprintln(b.out, "note:", n)
	}
	b.printTables()
	b.printRatios(details)
	if len(missing) > 0 {
		fmt.Fprintf(b.out, "not computed (a scenario or concurrency they need did not run): %s\n", strings.Join(missing, ", "))
	}
	if w := b.embeddedWarning(); w != "" {
		fmt.Fprintln(b.out, w)
	}

	if b.cfg.jsonPath != "" {
		if err := b.writeJSON(ratios, details); err != nil {
			return err
		}
		fmt.Fprintln(b.out, "wrote", b.cfg.jsonPath)
	}
	if b.cfg.svgPath != "" {
		f, err := os.Create(b.cfg.svgPath)
		if err != nil {
			return err
		}
		err = writeSVG(f, b.chart())
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", b.cfg.svgPath, err)
		}
		fmt.Fprintln(b.out, "wrote", b.cfg.svgPath)
	}
	return nil
}

// column is one metric in a table: its header and how a value reads.
type column struct {
	metric, header string
	format         func(float64) string
}

var columns = []column{
	{mOps, "ops/s", func(v float64) string { return fmt.Sprintf("%.0f", v) }},
	{mP50, "p50", fmtNs},
	{mP99, "p99", fmtNs},
	{mNsOp, "ns/op", func(v float64) string { return fmt.Sprintf("%.2f", v) }},
	{mAllocs, "allocs/op", func(v float64) string { return fmt.Sprintf("%.2f", v) }},
	{mLocalHit, "local hits", fmtShare},
	{mDupRatio, "duplicates", fmtShare},
	{mClientCPU, "client CPU µs/op", fmtMicros},
	{mRedisCPU, "redis CPU µs/op", fmtMicros},
	{mHostCPU, "host CPU µs/op", fmtMicros},
	{mCmdsPerRead, "redis cmds/read", func(v float64) string { return fmt.Sprintf("%.1f", v) }},
}

func fmtMicros(v float64) string { return fmt.Sprintf("%.2f", v) }

func fmtNs(v float64) string {
	return time.Duration(math.Round(v)).Round(100 * time.Nanosecond).String()
}

// plural writes "1 round", "3 rounds".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func fmtShare(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }

// scenarioTitles say what each table measures.
var scenarioTitles = map[string]string{
	"local":     "a. local tier hit (GOMAXPROCS goroutines; ns/op is wall time over all of them)",
	"ceiling":   "b. ceiling: SET NX PX pipelined 64 deep on 50 connections",
	"latency":   "b. one check at concurrency 1: Mark vs the SET NX PX it sends for a new key, sent directly (interleaved)",
	"store":     "b. unique keys (each goroutine checks a new key per call; CPU per op: this whole process, Redis's INFO cpu, and every CPU of the host)",
	"zipf":      fmt.Sprintf("c. Zipf mix (s=%g over %d keys; local tier %d keys)", zipfS, zipfUniverse, zipfLocalSize),
	"jetstream": "d. JetStream end to end (msgs/s until every message is acked; CPU per message: this process, Redis, and every CPU of the host, nats-server's included)",
	"tx":        "e. transactional marker on PostgreSQL (messages/s committed by -tx-concurrency consumers, a business row each; CPU per message: this process, Redis, and every CPU of the host, PostgreSQL's included)",
}

// printTables prints one table per scenario with the median of each metric.
func (b *bench) printTables() {
	var scenarios []string
	bySc := map[string][]*series{}
	for _, id := range b.res.order {
		s := b.res.byID[id]
		if bySc[s.Scenario] == nil {
			scenarios = append(scenarios, s.Scenario)
		}
		bySc[s.Scenario] = append(bySc[s.Scenario], s)
	}
	for _, sc := range scenarios {
		ss := bySc[sc]
		var cols []column
		for _, c := range columns {
			for _, s := range ss {
				if _, ok := s.Median[c.metric]; ok {
					cols = append(cols, c)
					break
				}
			}
		}
		fmt.Fprintf(b.out, "%s, median of %s\n", scenarioTitles[sc], plural(b.cfg.rounds, "round"))
		tw := tabwriter.NewWriter(b.out, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprint(tw, "variant\tconc\t")
		for _, c := range cols {
			fmt.Fprintf(tw, "%s\t", c.header)
		}
		fmt.Fprintln(tw)
		for _, s := range sortedForTable(ss) {
			conc := "-"
			if s.Concurrency > 0 {
				conc = fmt.Sprint(s.Concurrency)
			}
			fmt.Fprintf(tw, "%s\t%s\t", s.Variant, conc)
			for _, c := range cols {
				if v, ok := s.Median[c.metric]; ok {
					fmt.Fprintf(tw, "%s\t", c.format(v))
				} else {
					fmt.Fprint(tw, "-\t")
				}
			}
			fmt.Fprintln(tw)
		}
		tw.Flush()
		fmt.Fprintln(b.out)
	}
}

// sortedForTable orders a scenario's series by concurrency, keeping the order in
// which each concurrency's variants were first measured.
func sortedForTable(ss []*series) []*series {
	out := slices.Clone(ss)
	slices.SortStableFunc(out, func(a, b *series) int { return a.Concurrency - b.Concurrency })
	return out
}

// printRatios prints the ratio table: median, each round's value, the target.
func (b *bench) printRatios(details map[string]ratioResult) {
	fmt.Fprintf(b.out, "ratios (each the median of the ratios within a round)\n")
	tw := tabwriter.NewWriter(b.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ratio\tmedian\ttarget\t\trounds\tnum / den")
	for _, def := range ratioDefs {
		rr, ok := details[def.name]
		if !ok {
			continue
		}
		var rounds []string
		for _, v := range rr.Rounds {
			if v == nil {
				rounds = append(rounds, "-")
			} else {
				rounds = append(rounds, fmt.Sprintf("%.3g", *v))
			}
		}
		verdict := ""
		if rr.Met != nil {
			verdict = "met"
			if !*rr.Met {
				verdict = "NOT MET"
			}
			if rr.Reference {
				issue := "4"
				if strings.HasSuffix(def.name, "_issue22") {
					issue = "22"
				}
				verdict += " (issue " + issue + ", reference)"
			}
		}
		what := fmt.Sprintf("%s / %s (%s)", rr.Num, rr.Den, rr.Metric)
		if def.figure {
			what = fmt.Sprintf("%s (%s): a figure, not a ratio", rr.Num, rr.Metric)
		}
		fmt.Fprintf(tw, "%s\t%.3f\t%s\t%s\t%s\t%s\n", def.name, rr.Median, rr.Target, verdict,
			strings.Join(rounds, " "), what)
	}
	tw.Flush()
	if anyShown(details, func(def ratioDef) bool { return def.boundCmds > 0 }) {
		fmt.Fprintf(b.out, "jetstream_*_cpu_bound: the most this host's CPUs allow against the den in that round: its %d cores over the den's host CPU per message\n"+
			"  plus, per store command, a SET NX PX as cheap as in 64-deep pipelines (the lower Redis CPU of the two ceilings, plus go-redis's client CPU, per op); filter sends 1, Do 2\n", b.res.cores)
	}
	if anyShown(details, func(def ratioDef) bool { return def.atCostOf != "" }) {
		fmt.Fprintf(b.out, "store_*_at_rueidis_cost: the most this host's CPUs allow against the ceiling in that round if a check cost the host what a rueidis\n"+
			"  call sending only its commands costs (host CPU per op at concurrency 64): its %d cores over that cost, over the ceiling's rate;\n"+
			"  a client cheaper per call than rueidis goes above it\n", b.res.cores)
	}
}

// anyShown reports whether details holds a ratio whose definition is of the kind.
func anyShown(details map[string]ratioResult, kind func(ratioDef) bool) bool {
	for _, def := range ratioDefs {
		if _, ok := details[def.name]; ok && kind(def) {
			return true
		}
	}
	return false
}

// jsonReport is the document -json writes.
type jsonReport struct {
	Run      string                 `json:"run"`
	Revision string                 `json:"revision"` // the commit measured, "+modified" if the tree differed
	Started  time.Time              `json:"started"`
	Machine  machine                `json:"machine"`
	Config   jsonConfig             `json:"config"`
	Notes    []string               `json:"notes"`
	Series   []*series              `json:"series"`
	Ratios   map[string]float64     `json:"ratios"`
	Detailed map[string]ratioResult `json:"ratio_details"`
}

type machine struct {
	GOOS          string `json:"goos"`
	GOARCH        string `json:"goarch"`
	NumCPU        int    `json:"num_cpu"`
	GOMAXPROCS    int    `json:"gomaxprocs"`
	GoVersion     string `json:"go_version"`
	RedisVersion  string `json:"redis_version"`
	RedisEmbedded bool   `json:"redis_embedded"`
	NATSVersion   string `json:"nats_version,omitempty"`
	NATSEmbedded  bool   `json:"nats_embedded"`
	// Meaningful is false when an embedded server served the run: its figures then
	// say nothing about throughput.
	Meaningful bool `json:"meaningful"`
}

type jsonConfig struct {
	Rounds          int      `json:"rounds"`
	Duration        string   `json:"duration"`
	Concurrency     []int    `json:"concurrency"`
	Scenarios       []string `json:"scenarios"`
	CeilingRequests int      `json:"ceiling_requests"`
	JSMessages      int      `json:"js_messages"`
	JSConcurrency   int      `json:"js_concurrency"`
	KeyPrefix       string   `json:"key_prefix"`
	Stream          string   `json:"stream,omitempty"`
}

func (b *bench) writeJSON(ratios map[string]float64, details map[string]ratioResult) error {
	var scs []string
	for _, l := range scenarioLetters {
		if b.cfg.only[l] {
			scs = append(scs, l)
		}
	}
	doc := jsonReport{
		Run:      b.id,
		Revision: b.rev,
		Started:  b.started,
		Machine: machine{
			GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, NumCPU: runtime.NumCPU(),
			GOMAXPROCS: runtime.GOMAXPROCS(0), GoVersion: runtime.Version(),
			RedisVersion: b.redisVersion(), RedisEmbedded: b.srv.redisEmbedded,
			NATSVersion: b.js.serverVersion, NATSEmbedded: b.srv.natsEmbedded,
			Meaningful: !b.srv.redisEmbedded && !b.srv.natsEmbedded,
		},
		Config: jsonConfig{
			Rounds: b.cfg.rounds, Duration: b.cfg.duration.String(), Concurrency: b.cfg.concurrency,
			Scenarios: scs, CeilingRequests: b.cfg.ceilingRequests,
			JSMessages: b.cfg.jsMessages, JSConcurrency: b.cfg.jsConcurrency,
			KeyPrefix: b.prefix, Stream: b.js.stream,
		},
		Notes:    append([]string{}, b.notes...),
		Ratios:   ratios,
		Detailed: details,
	}
	for _, id := range b.res.order {
		doc.Series = append(doc.Series, b.res.byID[id])
	}
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(b.cfg.jsonPath, append(data, '\n'), 0o644)
}

// redisVersion returns the server's redis_version, or "miniredis".
func (b *bench) redisVersion() string {
	if b.srv.redisEmbedded {
		return "miniredis"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := b.plainRDB.Info(ctx, "server").Result()
	if err != nil {
		return "unknown: " + err.Error()
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v
		}
	}
	return "unknown"
}
