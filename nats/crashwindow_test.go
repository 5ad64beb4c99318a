package nats

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/embedded"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// The crash window of the Fetch batch path: a consumer process that pulls Fetch
// batches through JetStream.HandleBatch is SIGKILLed twice while it works through
// the stream. Its fn writes each run's side effect to a log file (one append per run)
// before it returns; the store it runs on logs each completion when it is sent and
// when it is answered. A message whose effect repeats after a kill is one whose run
// the killed process had not recorded DONE. That must be only the runs whose
// completion was in flight at the kill: not the runs that had finished earlier in
// the same batch, which a batch path that completes its items together at the end of
// the batch leaves behind (issue 18).

const fetchChildEnv = "DEDUPKIT_TEST_FETCH_CONSUMER"

// fetchChildConfig is what a fetch consumer process is told.
type fetchChildConfig struct {
	NATS, Redis, Prefix string
	Stream, Consumer    string
	Log                 string // the run log (see fetchLog)
	Lease               time.Duration
	Loops, Batch        int // fetch loops, each pulling Fetch(Batch) batches
}

// The run log's lines, one append each:
//
//	fx <key> <loop>  fn of fetch loop <loop> made its side effect for <key> (then returned)
//	cs <key>         the completion of <key>'s claim is sent to the store
//	cd <key>         it was answered: DONE
//	ce <key>         it was answered with an error

// TestHelperFetchConsumer is the fetch consumer process; it does nothing unless
// fetchChildEnv is set.
func TestHelperFetchConsumer(t *testing.T) {
	raw := os.Getenv(fetchChildEnv)
	if raw == "" {
		return
	}
	var cfg fetchChildConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatal(err)
	}
	runFetchChild(t, cfg)
}

// loggedStore logs each completion as it is sent and as it is answered.
type loggedStore struct {
	driver.Store
	log func(format string, args ...any)
}

func (s *loggedStore) Complete(ctx context.Context, entries []driver.Entry) ([]error, error) {
	for _, e := range entries {
		s.log("cs %s\n", e.Key)
	}
	errs, err := s.Store.Complete(ctx, entries)
	for i, e := range entries {
		ierr := err
		if err == nil {
			ierr = errs[i]
		}
		s.logAnswer(e.Key, ierr)
	}
	return errs, err
}

func (s *loggedStore) logAnswer(key string, err error) {
	if err != nil {
		s.log("ce %s\n", key)
		return
	}
	s.log("cd %s\n", key)
}

func runFetchChild(t *testing.T, cfg fetchChildConfig) {
	f, err := os.OpenFile(cfg.Log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	logf := func(format string, args ...any) {
		// one write(2) per line, O_APPEND: whole lines, in the order they were made,
		// and on disk (in the page cache) once it returns, whatever kills the process
		if _, err := f.WriteString(fmt.Sprintf(format, args...)); err != nil {
			panic(err)
		}
	}
	nc, err := natsgo.Connect(cfg.NATS, natsgo.Name("fetch-child-"+strconv.Itoa(os.Getpid())))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cons, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Redis})
	defer rdb.Close()
	rs, err := redisstore.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	d, err := dedup.New(&loggedStore{Store: rs, log: logf}, dedup.WithPrefix(cfg.Prefix), dedup.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	h, err := d.Register("orders", dedup.WithLease(cfg.Lease), dedup.WithRetention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	j, err := NewJetStream(h, cons, WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	go func() { // EOF on stdin: stop
		s := bufio.NewScanner(os.Stdin)
		for s.Scan() {
		}
		close(stop)
	}()
	var wg sync.WaitGroup
	for loop := range cfg.Loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn := func(ctx context.Context, m *Msg) error {
				time.Sleep(time.Millisecond + rand.N(9*time.Millisecond)) // 1-10 ms of work
				logf("fx %s %d\n", m.Header(jetstream.MsgIDHeader), loop)
				return nil
			}
			for {
				select {
				case <-stop:
					return
				default:
				}
				batch, err := cons.Fetch(cfg.Batch, jetstream.FetchMaxWait(300*time.Millisecond))
				if err != nil {
					time.Sleep(50 * time.Millisecond)
					continue
				}
				if _, err := j.HandleBatch(ctx, batch, fn); err != nil && !isFetchTimeout(err) {
					emit("batch-error", strconv.Quote(err.Error()))
				}
			}
		}()
	}
	emit("ready")
	wg.Wait()
	d.Close()
}

func isFetchTimeout(err error) bool {
	return strings.Contains(err.Error(), "timeout")
}

// fetchLog is one process's run log, read back by the parent.
type fetchLog struct {
	effects []fetchEffect  // in log order
	sent    map[string]int // key -> line of its first "cs"
	done    map[string]bool
}

type fetchEffect struct {
	key  string
	loop string
	line int
}

func readFetchLog(t *testing.T, path string) fetchLog {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	l := fetchLog{sent: map[string]int{}, done: map[string]bool{}}
	// a record key is <prefix>:orders:<key>: the message key is after the last ':'
	msgKey := func(rk string) string { return rk[strings.LastIndexByte(rk, ':')+1:] }
	for n, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 3 && f[0] == "fx":
			l.effects = append(l.effects, fetchEffect{key: f[1], loop: f[2], line: n})
		case len(f) == 2 && f[0] == "cs":
			if _, ok := l.sent[msgKey(f[1])]; !ok {
				l.sent[msgKey(f[1])] = n
			}
		case len(f) == 2 && f[0] == "cd":
			l.done[msgKey(f[1])] = true
		case len(f) == 2 && f[0] == "ce", line == "":
		default:
			t.Fatalf("%s: line %d unreadable: %q", path, n, line)
		}
	}
	return l
}

// atKill sorts the runs of a killed process that had no DONE answer. A run was in
// flight at the kill when its completion had been sent before its fetch loop
// finished another run, or when the loop had finished none since (nothing else had
// happened on that loop: its completion was on its way out). A run is held when its
// loop finished another run before its completion was sent: it waited for the rest
// of its batch.
func (l fetchLog) atKill() (inFlight, held []string) {
	next := make([]int, len(l.effects)) // line of the loop's next effect; -1: none
	lastAt := map[string]int{}          // loop -> index of its latest effect so far
	for i, e := range l.effects {
		next[i] = -1
		if j, ok := lastAt[e.loop]; ok {
			next[j] = e.line
		}
		lastAt[e.loop] = i
	}
	for i, e := range l.effects {
		if l.done[e.key] {
			continue
		}
		sentAt, sent := l.sent[e.key]
		if next[i] >= 0 && (!sent || sentAt > next[i]) {
			held = append(held, e.key)
		} else {
			inFlight = append(inFlight, e.key)
		}
	}
	return inFlight, held
}

// A consumer on Fetch batches of 25, four fetch loops, fn sleeping 1-10 ms, SIGKILLed
// twice during 2,000 messages: nothing is lost, and the messages that run twice are at
// most the ones whose completion was in flight at each kill.
func TestFetchBatchCrashRepeatsOnlyInFlightCompletions(t *testing.T) {
	const messages, loops, batch = 2000, 4, 25
	const lease, ackWait = time.Second, time.Second
	eachServer(t, func(t *testing.T, e *env) {
		rs := testenv.SpawnRedis(t)
		e.newStream()
		c := e.consumer("orders", func(cc *jetstream.ConsumerConfig) {
			cc.AckWait = ackWait
			cc.MaxDeliver = 100
			cc.MaxAckPending = 4 * loops * batch
		})
		futures := make([]jetstream.PubAckFuture, 0, messages)
		for i := range messages {
			m := natsgo.NewMsg(e.subject + ".new")
			m.Data = []byte("order")
			m.Header.Set(jetstream.MsgIDHeader, fmt.Sprint("order-", i))
			f, err := e.js.PublishMsgAsync(m)
			if err != nil {
				t.Fatal(err)
			}
			futures = append(futures, f)
		}
		var last uint64
		for _, f := range futures {
			select {
			case ack := <-f.Ok():
				last = max(last, ack.Sequence)
			case err := <-f.Err():
				t.Fatal(err)
			case <-time.After(10 * time.Second):
				t.Fatal("publish: no ack after 10s")
			}
		}
		cfg := fetchChildConfig{
			NATS: e.nc.ConnectedUrl(), Redis: rs.Addr(), Prefix: testenv.Prefix(),
			Stream: "DKT_" + e.id, Consumer: "orders", Lease: lease, Loops: loops, Batch: batch,
		}
		dir := t.TempDir()
		var logs []string
		start := func() *fetchChild {
			cfg.Log = filepath.Join(dir, fmt.Sprintf("run-%d.log", len(logs)))
			logs = append(logs, cfg.Log)
			return startFetchChild(t, cfg)
		}
		effectsIn := func(path string) int {
			raw, _ := os.ReadFile(path)
			return strings.Count(string(raw), "fx ")
		}
		// kill at about a third and two thirds of the messages
		var killed []string
		for k := range 2 {
			p := start()
			at := (k + 1) * messages / 3
			testenv.Eventually(t, 60*time.Second, fmt.Sprintf("%d effects before kill %d", at, k+1), func() bool {
				total := 0
				for _, l := range logs {
					total += effectsIn(l)
				}
				return total >= at
			})
			p.kill()
			killed = append(killed, cfg.Log)
		}
		p := start()
		testenv.Eventually(t, 60*time.Second, "every message acked", func() bool {
			ci := e.info(c)
			return ci.NumAckPending == 0 && ci.NumPending == 0 && ci.AckFloor.Stream >= last
		})
		p.stop()

		runs := map[string][]int{} // key -> the logs (by index) whose fn made its effect
		parsed := make([]fetchLog, len(logs))
		for i, path := range logs {
			parsed[i] = readFetchLog(t, path)
			for _, fx := range parsed[i].effects {
				runs[fx.key] = append(runs[fx.key], i)
			}
		}
		lost := 0
		for i := range messages {
			if len(runs[fmt.Sprint("order-", i)]) == 0 {
				lost++
			}
		}
		totalRepeats := 0
		for _, r := range runs {
			totalRepeats += len(r) - 1
		}
		explained := 0
		for k := range killed {
			inFlight, held := parsed[k].atKill()
			repeats := 0
			for _, key := range append(append([]string(nil), inFlight...), held...) {
				if slices.ContainsFunc(runs[key], func(i int) bool { return i > k }) { // it ran again
					repeats++
				}
			}
			explained += repeats
			t.Logf("kill %d: %d effects logged; %d runs repeated after it; %d completions in flight at the kill, %d runs held unsent",
				k+1, len(parsed[k].effects), repeats, len(inFlight), len(held))
			if repeats > len(inFlight) {
				t.Errorf("kill %d: %d runs repeated, but only %d completions were in flight (%d runs had finished and waited, unsent)",
					k+1, repeats, len(inFlight), len(held))
			}
		}
		t.Logf("%d messages, %d lost, %d repeated in all", messages, lost, totalRepeats)
		if lost != 0 {
			t.Errorf("%d messages lost", lost)
		}
		if totalRepeats != explained {
			t.Errorf("%d repeats in all, %d of them after a kill's unrecorded runs", totalRepeats, explained)
		}
	})
}

// fetchChild is a fetch consumer process.
type fetchChild struct {
	t      *testing.T
	cmd    *exec.Cmd
	in     *os.File
	done   chan struct{} // closed once reaped
	err    error         // cmd.Wait's, once done
	stderr strings.Builder
}

func startFetchChild(t *testing.T, cfg fetchChildConfig) *fetchChild {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := &fetchChild{t: t, done: make(chan struct{})}
	p.cmd = exec.Command(exe, "-test.run=^TestHelperFetchConsumer$", "-test.count=1", "-test.timeout=3m")
	p.cmd.Env = append(os.Environ(), fetchChildEnv+"="+string(raw))
	p.cmd.Stderr = &p.stderr // read only once reaped
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdin, p.in = r, w
	embedded.DieWithParent(p.cmd)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	ready := make(chan struct{})
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			switch line := s.Text(); {
			case line == "DKT ready":
				close(ready)
			case strings.HasPrefix(line, "DKT batch-error"):
				t.Logf("fetch child %d: %s", p.cmd.Process.Pid, line)
			}
		}
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("fetch child %d stderr:\n%s", p.cmd.Process.Pid, p.stderr.String())
		}
	})
	select {
	case <-ready:
	case <-p.done:
		t.Fatalf("fetch child exited before it was ready: %v\n%s", p.err, p.stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("fetch child not ready after 30s")
	}
	return p
}

// kill SIGKILLs the process (a no-op once it has exited) and reaps it.
func (p *fetchChild) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
	p.in.Close()
}

// stop ends the process cleanly (EOF on stdin) and fails the test unless it exits 0.
func (p *fetchChild) stop() {
	p.t.Helper()
	p.in.Close()
	select {
	case <-p.done:
		if p.err != nil {
			p.t.Fatalf("fetch child: %v\n%s", p.err, p.stderr.String())
		}
	case <-time.After(30 * time.Second):
		p.kill()
		p.t.Fatal("fetch child did not stop within 30s")
	}
}
