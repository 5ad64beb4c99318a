// Command bench measures dedupkit side by side with what it replaces and with what
// Redis and NATS can do at most, on the machine it runs on:
//
//   - a: the local tier: a hit in lru.Cache (and a Handler.Mark answered by it)
//     against sync.Map.Load, in ns/op and allocs/op, and an insert (lru-add, the
//     local_insert_ns figure);
//   - b: unique keys through Redis at each concurrency (-concurrency), in filter
//     mode (Mark) and Do mode, against the naive way (one go-redis SetNX per message),
//     against rueidis (an auto-pipelining Go client) sending only the commands a check
//     must send, against one go-redis SetNX per call through go-redis's AutoPipeline,
//     and against the ceiling (redis-benchmark -P 64 SET NX PX, when it is
//     on PATH and the server is real; and go-redis pipelines of 64); plus the latency
//     of one Mark at concurrency 1 against the SET NX PX it sends, sent directly,
//     interleaved;
//   - c: a duplicate-heavy Zipf mix in filter mode, with the local tier's hit ratio;
//   - d: JetStream end to end: consuming a stream with Ack only, through the dnats
//     adapter in filter and Do mode (-js-concurrency messages at once), and the naive
//     way.
//
// Every selected scenario runs once in each round (-rounds), one after the other,
// so that a noisy neighbour hits all of them alike; the tables give the median of the
// rounds, and each ratio is the median of the ratios taken within a round. -json
// writes every round, the medians and the ratios; -svg draws the throughput.
//
// With no -redis and -nats (nor DEDUP_REDIS_ADDR and DEDUP_NATS_URL) it runs on
// miniredis and an in-process NATS server: it works, and its figures then mean nothing
// for throughput. On real servers it writes only keys under a prefix of its own and
// one stream of its own. It deletes its keys after every measurement (outside its
// timers: Redis's hash-table resizes would otherwise land in later measurements, see
// forget) and at exit, and the stream at exit (SCAN and UNLINK, never FLUSHDB).
//
//	go run ./bench
//	go run ./bench -redis 127.0.0.1:6379 -nats nats://127.0.0.1:4222 -json out.json -svg out.svg
//
// `go run ./bench soak` is the chaos soak instead (soak.go): consumer processes, faults
// injected throughout, one JSON line, and a non-zero exit unless no message was lost
// and none succeeded twice.
//
// `go run ./bench stall` counts nats.go's Consume stalls instead (stall.go): runs of a
// stream through a JetStream handler, and those in which Consume reported a missed
// heartbeat.
//
// `go run ./bench copies` prints issue 26's figure for copies (copies.go): orders
// published twice, back to back, to two instances with default options, drained
// against the same orders published once; every order run exactly once. It exits
// non-zero when the figure fails.
//
// `go run ./bench outage` prints issue 26's figure for a Redis outage (outage.go): a
// steady transactional load (default options) while the Redis it
// spawns is SIGKILLed, its messages/s during the outage against before it, with 0
// lost and 0 repeated effects. It exits non-zero when the figure fails.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/internal/embedded"
	dnats "github.com/dedupkit/dedupkit/nats"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// config is what the flags say.
type config struct {
	redisAddr, natsURL string
	rounds             int
	duration           time.Duration // of each timed measurement in scenarios a, b and c
	concurrency        []int
	only               map[string]bool // scenario letters to run
	ceilingRequests    int
	jsMessages         int
	jsConcurrency      int // dnats.WithConcurrency of the dedup variants
	jsTimeout          time.Duration
	jsonPath, svgPath  string
	cpuProfile         string
	postgres           string // scenario e's database; "" skips it
	txConcurrency      int    // scenario e's consumers
	txDupKeys          int    // committed messages each dup-* variant of scenario e cycles through
}

// scenarioLetters are the scenarios, in the order each round runs them.
var scenarioLetters = []string{"a", "b", "c", "d", "e"}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	var conc, only string
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.redisAddr, "redis", os.Getenv("DEDUP_REDIS_ADDR"), "Redis address (default: an embedded miniredis; env DEDUP_REDIS_ADDR)")
	fs.StringVar(&c.natsURL, "nats", os.Getenv("DEDUP_NATS_URL"), "NATS URL (default: an in-process server; env DEDUP_NATS_URL)")
	fs.IntVar(&c.rounds, "rounds", 5, "rounds; each runs every selected scenario once")
	fs.DurationVar(&c.duration, "duration", time.Second, "length of each timed measurement (scenarios a, b, c)")
	fs.StringVar(&conc, "concurrency", "1,16,64,256", "concurrencies of scenario b")
	fs.StringVar(&only, "only", "a,b,c,d,e", "scenarios to run: a local tier, b unique keys, c Zipf mix, d JetStream, e transactional marker (needs -postgres)")
	fs.StringVar(&c.postgres, "postgres", os.Getenv("DEDUP_POSTGRES_URL"), "PostgreSQL URL of scenario e (env DEDUP_POSTGRES_URL; without it scenario e is skipped)")
	fs.IntVar(&c.txConcurrency, "tx-concurrency", 8, "consumers (goroutines) of scenario e")
	fs.IntVar(&c.txDupKeys, "tx-dup-keys", 2000, "committed messages each dup-* variant of scenario e cycles through, committed one at a time before each measurement; a multiple of -tx-concurrency")
	fs.IntVar(&c.ceilingRequests, "ceiling-requests", 500_000, "requests of each redis-benchmark run")
	// 50k: at 200k msg/s raw-ack still spans 25 ticks of /proc/stat (10 ms each)
	fs.IntVar(&c.jsMessages, "js-messages", 50_000, "messages in the JetStream stream; each variant reads them all")
	fs.IntVar(&c.jsConcurrency, "js-concurrency", dnats.DefaultConcurrency, "messages each dedup variant of scenario d handles at once (dnats.WithConcurrency); above the consumers' MaxAckPending (1000) it changes nothing")
	fs.DurationVar(&c.jsTimeout, "js-timeout", 2*time.Minute, "give up on a JetStream variant that has not acked every message by then")
	fs.StringVar(&c.jsonPath, "json", "", "write the results to this file as JSON")
	fs.StringVar(&c.svgPath, "svg", "", "draw the throughput chart to this file")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof; samples of scenarios b and d carry labels: -tagfocus variant=dedup-filter)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if c.concurrency, err = parseInts(conc); err != nil {
		return c, fmt.Errorf("-concurrency: %w", err)
	}
	c.only = map[string]bool{}
	for _, s := range strings.Split(only, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(scenarioLetters, s) {
			return c, fmt.Errorf("-only: unknown scenario %q (want some of a,b,c,d,e)", s)
		}
		c.only[s] = true
	}
	switch {
	case c.rounds < 1 || c.rounds > 100:
		return c, fmt.Errorf("-rounds %d is outside 1..100", c.rounds)
	case c.duration < time.Millisecond:
		return c, fmt.Errorf("-duration %v is below 1ms", c.duration)
	case c.ceilingRequests < 1:
		return c, fmt.Errorf("-ceiling-requests %d is not positive", c.ceilingRequests)
	case c.jsMessages < 1 || c.jsMessages > 10_000_000:
		return c, fmt.Errorf("-js-messages %d is outside 1..10000000", c.jsMessages)
	case c.jsConcurrency < 1 || c.jsConcurrency > dnats.MaxConcurrency:
		return c, fmt.Errorf("-js-concurrency %d is outside 1..%d", c.jsConcurrency, dnats.MaxConcurrency)
	case c.jsTimeout <= 0:
		return c, fmt.Errorf("-js-timeout %v is not positive", c.jsTimeout)
	case c.txConcurrency < 1 || c.txConcurrency > 256:
		return c, fmt.Errorf("-tx-concurrency %d is outside 1..256", c.txConcurrency)
	case c.txDupKeys < c.txConcurrency || c.txDupKeys%c.txConcurrency != 0:
		return c, fmt.Errorf("-tx-dup-keys %d is not a positive multiple of -tx-concurrency %d", c.txDupKeys, c.txConcurrency)
	}
	return c, nil
}

// parseInts reads a list such as "1,16,64": distinct values from 1 to 4096, in order.
func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		if n < 1 || n > 4096 {
			return nil, fmt.Errorf("%d is outside 1..4096", n)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}

// servers are the Redis and NATS the run uses, and whether they are embedded ones.
type servers struct {
	redisAddr     string
	redisEmbedded bool
	natsURL       string // empty when scenario d is not selected
	natsEmbedded  bool
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "soak":
			return runSoak(ctx, args[1:], stdout, os.Stderr)
		case "soak-consumer": // a consumer process the soak starts
			return runSoakConsumer(ctx, args[1:], os.Stderr)
		case "stall":
			return runStall(ctx, args[1:], stdout, os.Stderr)
		case "copies":
			return runCopies(ctx, args[1:], stdout, os.Stderr)
		case "outage":
			return runOutage(ctx, args[1:], stdout, os.Stderr)
		}
	}
	cfg, err := parseFlags(args, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	srv, stop, err := startServers(cfg)
	if err != nil {
		return err
	}
	defer stop()
	if cfg.cpuProfile != "" {
		f, err := os.Create(cfg.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	return runBench(ctx, cfg, srv, stdout)
}

// startServers returns the configured servers, starting embedded ones for those not
// given; stop shuts down what it started.
func startServers(cfg config) (servers, func(), error) {
	srv := servers{redisAddr: cfg.redisAddr, natsURL: cfg.natsURL}
	var stops []func()
	stop := func() {
		for _, f := range slices.Backward(stops) {
			f()
		}
	}
	if srv.redisAddr == "" {
		m, err := embedded.StartRedis()
		if err != nil {
			return srv, nil, err
		}
		stops = append(stops, m.Close)
		srv.redisAddr, srv.redisEmbedded = m.Addr(), true
	}
	if !cfg.only["d"] {
		srv.natsURL = ""
	} else if srv.natsURL == "" {
		dir, err := os.MkdirTemp("", "dedupkit-bench-")
		if err != nil {
			stop()
			return srv, nil, err
		}
		n, err := embedded.StartNATS(dir)
		if err != nil {
			os.RemoveAll(dir)
			stop()
			return srv, nil, err
		}
		stops = append(stops, func() { n.Close(); os.RemoveAll(dir) })
		srv.natsURL, srv.natsEmbedded = n.URL(), true
	}
	return srv, stop, nil
}

// runID returns 8 random hex digits that name this run's keys and stream.
func runID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// quietRedis drops go-redis's own log lines, which would interleave with the tables.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

func init() { redis.SetLogger(quietRedis{}) }
