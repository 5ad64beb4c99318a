package nats

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/embedded"
	"github.com/dedupkit/dedupkit/keys"
	"github.com/dedupkit/dedupkit/sqltx"
)

// The process-level tests run consumers as child processes: the test binary runs
// itself with -test.run=^TestHelperConsumer$ and the consumer's settings in
// childEnv, so that a test can SIGKILL, SIGSTOP and SIGCONT a real consumer.
// A child reports what happens on its stdout, one "DKT <kind> <fields…>" line each,
// and records its handler's side effects in Redis lists under the test's prefix
// (<prefix>:fx:started and <prefix>:fx:done, one "<key>@<pid>" entry per run), where
// the parent reads them whatever became of the child.

const childEnv = "DEDUPKIT_TEST_CONSUMER"

// childConfig is what a child consumer is told.
type childConfig struct {
	NATS, Redis, Prefix string
	Stream, Consumer    string
	Lease               time.Duration
	// Mode "next": handle one message (Consumer.Next) and no more; "consume": every
	// message it gets (Consumer.Consume).
	Mode string
	// Fn is what the handler does for Key (every key when Key is ""); other keys get
	// "work". Every run first records "started".
	//   work:        record "done", return nil
	//   block:       wait for the context (the test kills the child meanwhile)
	//   hold:        wait for a "finish" line on stdin, then record "done" and return
	//                nil; return the context's cause if it ends first
	//   hold-ignore: as hold, but ignore the context (report its end, keep waiting)
	Fn, Key string
	// DB, when set, makes the handler transactional (HandleTx, package sqltx) on this
	// database: "postgres" (DSN is its URL), with the marker table Markers; every
	// run also inserts "<key>", pid into Orders, in its transaction. Plain, with DB
	// set: no transaction, and the insert is committed on its own at once.
	DB, DSN, Markers, Orders string
	Plain                    bool
	// HangComplete: the completion of Key's claim is never sent, nor its ack; the
	// child reports "completing <key>" and waits to be killed (a crash between COMMIT
	// and Complete: a transactional run acks after its COMMIT, without waiting for
	// the completion, so the ack is held back too).
	HangComplete bool
}

// heldAck is a delivery whose acks are never sent.
type heldAck struct{ jetstream.Msg }

func (heldAck) Ack() error                       { return nil }
func (heldAck) DoubleAck(context.Context) error  { return nil }
func (heldAck) Nak() error                       { return nil }
func (heldAck) NakWithDelay(time.Duration) error { return nil }
func (heldAck) Term() error                      { return nil }

// hangingStore is a store whose Complete of one record key never returns: the child
// reports it and waits for its SIGKILL.
type hangingStore struct {
	driver.Store
	key string
}

func (s *hangingStore) Complete(ctx context.Context, entries []driver.Entry) ([]error, error) {
	for _, e := range entries {
		s.hang(e.Key)
	}
	return s.Store.Complete(ctx, entries)
}

func (s *hangingStore) hang(key string) {
	if key == s.key {
		emit("completing", key[strings.LastIndexByte(key, ':')+1:])
		select {}
	}
}

// TestHelperConsumer is the child consumer; it does nothing unless childEnv is set.
func TestHelperConsumer(t *testing.T) {
	raw := os.Getenv(childEnv)
	if raw == "" {
		return // run as a test of its own: nothing to do
	}
	var cfg childConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatal(err)
	}
	runChild(t, cfg)
}

// emit writes one event line for the parent.
var emitMu sync.Mutex

func emit(kind string, fields ...any) {
	emitMu.Lock()
	defer emitMu.Unlock()
	fmt.Fprintln(os.Stdout, append([]any{"DKT", kind}, fields...)...)
}

func runChild(t *testing.T, cfg childConfig) {
	ctx := context.Background()
	nc, err := natsgo.Connect(cfg.NATS, natsgo.Name("child-"+strconv.Itoa(os.Getpid())))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
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
	var store driver.Store = rs
	if cfg.HangComplete {
		store = &hangingStore{Store: rs, key: keys.RecordKey(cfg.Prefix, "orders", cfg.Key)}
	}
	d, err := dedup.New(store, dedup.WithPrefix(cfg.Prefix), dedup.WithLogger(quiet))
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

	// stdin: "finish" lines release held handlers; EOF ends the child
	finish, quit := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(quit)
		s := bufio.NewScanner(os.Stdin)
		closed := false
		for s.Scan() {
			if s.Text() == "finish" && !closed {
				close(finish)
				closed = true
			}
		}
	}()

	pid := strconv.Itoa(os.Getpid())
	effect := func(kind, key string) {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := rdb.RPush(rctx, cfg.Prefix+":fx:"+kind, key+"@"+pid).Err(); err != nil {
			emit("effect-error", key, err)
		}
	}
	fn := func(ctx context.Context, m *Msg) error {
		key := m.Header(jetstream.MsgIDHeader)
		effect("started", key)
		emit("started", key, m.Metadata().Sequence.Stream)
		how := cfg.Fn
		if cfg.Key != "" && key != cfg.Key {
			how = "work"
		}
		switch how {
		case "block":
			<-ctx.Done()
			return context.Cause(ctx)
		case "hold":
			select {
			case <-finish:
			case <-ctx.Done():
				emit("ctx-done", key, strconv.Quote(context.Cause(ctx).Error()))
				return context.Cause(ctx)
			}
		case "hold-ignore":
			returned := make(chan struct{})
			defer close(returned)
			go func() {
				select {
				case <-ctx.Done():
					emit("ctx-done", key, strconv.Quote(context.Cause(ctx).Error()))
				case <-returned:
				}
			}()
			<-finish
		}
		effect("done", key)
		return nil
	}
	handle := func(msg jetstream.Msg) {
		res, act := j.Handle(ctx, msg, fn)
		md, _ := msg.Metadata()
		emit("result", msg.Headers().Get(jetstream.MsgIDHeader), md.Sequence.Stream, md.NumDelivered, res.Outcome, act)
	}
	if cfg.DB != "" {
		db, err := sql.Open("pgx", cfg.DSN)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		insert := func(ctx context.Context, exec func(context.Context, string, ...any) (sql.Result, error), key string) error {
			_, err := exec(ctx, "INSERT INTO "+cfg.Orders+" (order_key, pid) VALUES ($1, $2)", key, os.Getpid())
			return err
		}
		if cfg.Plain { // the effect committed on its own, before DONE: no marker
			plain := fn
			fn = func(ctx context.Context, m *Msg) error {
				if err := insert(ctx, db.ExecContext, m.Header(jetstream.MsgIDHeader)); err != nil {
					return err
				}
				return plain(ctx, m)
			}
		} else {
			tr, err := sqltx.New(db, sqltx.PostgreSQL, sqltx.WithTable(cfg.Markers))
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			handle = func(msg jetstream.Msg) {
				if cfg.HangComplete && msg.Headers().Get(jetstream.MsgIDHeader) == cfg.Key {
					msg = heldAck{msg}
				}
				res, act := HandleTx(ctx, j, msg, tr, func(ctx context.Context, m *Msg, tx *sql.Tx) error {
					if err := insert(ctx, tx.ExecContext, m.Header(jetstream.MsgIDHeader)); err != nil {
						return err
					}
					return fn(ctx, m)
				})
				md, _ := msg.Metadata()
				key := msg.Headers().Get(jetstream.MsgIDHeader)
				emit("result", key, md.Sequence.Stream, md.NumDelivered, res.Outcome, act)
				emit("tier", key, res.Tier)
			}
		}
	}

	switch cfg.Mode {
	case "next":
		emit("ready")
		msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		handle(msg)
	case "consume":
		cc, err := cons.Consume(handle, jetstream.PullExpiry(time.Second), jetstream.ConsumeErrHandler(func(jetstream.ConsumeContext, error) {}))
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			cc.Stop()
			<-cc.Closed()
		}()
		emit("ready")
	default:
		t.Fatalf("mode %q", cfg.Mode)
	}
	<-quit
	s := j.Stats()
	emit("stats", "acks", s.Count(ActAck), "naks", s.Count(ActNak)+s.Count(ActNakWithDelay), "terms", s.Count(ActTerm),
		"lease-lost", h.Stats().HeartbeatLeaseLost)
	d.Close()
}

// --- the parent's side ------------------------------------------------------------

// event is one line a child reported: its kind and fields.
type event struct {
	kind   string
	fields []string
}

func (e event) String() string { return e.kind + " " + strings.Join(e.fields, " ") }

// result is a "result" event: key, stream sequence, NumDelivered, outcome, action.
func (e event) result() (key string, seq uint64, outcome, action string, ok bool) {
	if e.kind != "result" || len(e.fields) != 5 {
		return "", 0, "", "", false
	}
	seq, _ = strconv.ParseUint(e.fields[1], 10, 64)
	return e.fields[0], seq, e.fields[3], e.fields[4], true
}

// child is a consumer process a test started.
type child struct {
	t     *testing.T
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	read  chan struct{} // closed when its stdout is drained

	mu     sync.Mutex
	events []event
	stderr bytes.Buffer
	exited bool
}

func (c *child) Write(p []byte) (int, error) { // stderr
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stderr.Write(p)
}

// startChild starts a consumer process; cleanup kills it if the test has not stopped it.
func startChild(t *testing.T, name string, cfg childConfig) *child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &child{t: t, name: name, read: make(chan struct{})}
	c.cmd = exec.Command(exe, "-test.run=^TestHelperConsumer$", "-test.count=1", "-test.timeout=2m")
	c.cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	c.cmd.Stderr = c
	embedded.DieWithParent(c.cmd)
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.read)
		s := bufio.NewScanner(out)
		for s.Scan() {
			f := strings.Fields(s.Text())
			if len(f) < 2 || f[0] != "DKT" {
				continue // the test binary's own output
			}
			c.mu.Lock()
			c.events = append(c.events, event{kind: f[1], fields: f[2:]})
			c.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		c.kill()
		if t.Failed() {
			t.Logf("child %s: events %v; stderr:\n%s", c.name, c.all(), c.errText())
		}
	})
	c.waitFor(30*time.Second, "ready", func(e event) bool { return e.kind == "ready" })
	return c
}

func (c *child) all() []event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]event(nil), c.events...)
}

func (c *child) errText() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stderr.String()
}

// waitFor returns the first event that match accepts, failing the test after timeout.
func (c *child) waitFor(timeout time.Duration, what string, match func(event) bool) event {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, e := range c.all() {
			if match(e) {
				return e
			}
		}
		select {
		case <-c.read:
			for _, e := range c.all() { // the last lines may have come with the end
				if match(e) {
					return e
				}
			}
			c.t.Fatalf("child %s ended before %s; stderr:\n%s", c.name, what, c.errText())
		default:
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("child %s: no %s after %v; events: %v", c.name, what, timeout, c.all())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// results returns the child's result events for key, in order.
func (c *child) results(key string) []event {
	var out []event
	for _, e := range c.all() {
		if k, _, _, _, ok := e.result(); ok && k == key {
			out = append(out, e)
		}
	}
	return out
}

func (c *child) signal(sig syscall.Signal) {
	c.t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		c.t.Fatalf("child %s: %v: %v", c.name, sig, err)
	}
}

// send writes a line to the child's stdin.
func (c *child) send(line string) {
	c.t.Helper()
	if _, err := io.WriteString(c.stdin, line+"\n"); err != nil {
		c.t.Fatalf("child %s: %v", c.name, err)
	}
}

// kill sends SIGKILL to the child's PID and reaps it. No-op once it has exited.
func (c *child) kill() {
	c.mu.Lock()
	exited := c.exited
	c.exited = true
	c.mu.Unlock()
	if exited {
		return
	}
	_ = c.cmd.Process.Kill()
	_ = c.cmd.Wait()
	<-c.read
}

// stop ends the child cleanly (EOF on stdin) and fails the test unless it exits 0
// within 20s (its goroutine-leak and race checks included).
func (c *child) stop() event {
	c.t.Helper()
	c.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		_ = c.cmd.Process.Kill()
		err = errors.Join(errors.New("did not exit within 20s"), <-done)
	}
	<-c.read
	c.mu.Lock()
	c.exited = true
	c.mu.Unlock()
	if err != nil {
		c.t.Fatalf("child %s: %v; stderr:\n%s", c.name, err, c.errText())
	}
	return c.waitFor(time.Second, "stats", func(e event) bool { return e.kind == "stats" })
}

// effects reads a side-effect list: the "<key>@<pid>" entries, in order.
func effects(t *testing.T, rdb *redis.Client, prefix, kind string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := rdb.LRange(ctx, prefix+":fx:"+kind, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// by returns the entry "<key>@<child's pid>".
func (c *child) by(key string) string { return key + "@" + strconv.Itoa(c.cmd.Process.Pid) }
