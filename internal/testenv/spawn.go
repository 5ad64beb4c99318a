package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Proc is a server process a test started itself (redis-server or nats-server): on a
// loopback port of its own, with its data directory and log file in a directory of
// its own. It can be killed (SIGKILL), paused (SIGSTOP), resumed, and started again on
// the same port, directory and arguments. Every signal goes to its PID; nothing is
// ever killed by name. Safe for concurrent use.
type Proc struct {
	name  string
	bin   string
	argv  []string
	port  int
	dir   string
	ready func(p *Proc) error

	mu  sync.Mutex
	cmd *exec.Cmd
	log *os.File
}

// readyTimeout bounds a server's start (a Redis loading its AOF included).
const readyTimeout = 10 * time.Second

// StartRedis starts redis-server on a free loopback port with its data in dir:
// no snapshots and no AOF unless args (appended last, so they win) say otherwise. It
// returns once the server answers PING. The error wraps exec.ErrNotFound when
// redis-server is not on PATH. The caller stops it with Kill.
func StartRedis(dir string, args ...string) (*Proc, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	argv := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no"}, args...)
	return start("redis-server", argv, port, dir, redisReady)
}

// StartNATS starts nats-server with JetStream on a free loopback port, storing under
// dir, and returns once it greets a client. The error wraps exec.ErrNotFound when
// nats-server is not on PATH. The caller stops it with Kill.
func StartNATS(dir string, args ...string) (*Proc, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	argv := append([]string{"-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", filepath.Join(dir, "js")}, args...)
	return start("nats-server", argv, port, dir, natsReady)
}

// SpawnRedis is StartRedis for one test: its directory is under t.TempDir(), a
// missing redis-server skips the test (SkipNoServer), and cleanup kills it.
func SpawnRedis(t testing.TB, args ...string) *Proc {
	t.Helper()
	return spawn(t, "redis-server", func(dir string) (*Proc, error) { return StartRedis(dir, args...) })
}

// SpawnNATS is StartNATS for one test: its directory is under t.TempDir(), a missing
// nats-server skips the test (SkipNoServer), and cleanup kills it.
func SpawnNATS(t testing.TB, args ...string) *Proc {
	t.Helper()
	return spawn(t, "nats-server", func(dir string) (*Proc, error) { return StartNATS(dir, args...) })
}

func spawn(t testing.TB, name string, startFn func(dir string) (*Proc, error)) *Proc {
	t.Helper()
	p, err := startFn(t.TempDir())
	if errors.Is(err, exec.ErrNotFound) {
		SkipNoServer(t, "%s is not on PATH", name)
	}
	if err != nil {
		t.Fatal(err)
	}
	// Registered after t.TempDir, so it runs before the directory is removed.
	t.Cleanup(p.Kill)
	return p
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func start(name string, argv []string, port int, dir string, ready func(*Proc) error) (*Proc, error) {
	bin, err := exec.LookPath(name)
	if err != nil {
		return nil, err
	}
	p := &Proc{name: name, bin: bin, argv: argv, port: port, dir: dir, ready: ready}
	if err := p.Start(); err != nil {
		return nil, err
	}
	return p, nil
}

// Start starts the server again after Kill: same binary, port, directory and
// arguments. It returns once the server is ready, or an error holding the end of its
// log. Starting a running server is an error.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s on port %d is already running", p.name, p.port)
	}
	log, err := os.OpenFile(filepath.Join(p.dir, p.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.argv...)
	cmd.Stdout, cmd.Stderr = log, log // files: no copying goroutine to stop
	DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.cmd, p.log = cmd, log
	deadline := time.Now().Add(readyTimeout)
	for {
		err := p.ready(p)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			p.killLocked()
			return fmt.Errorf("%s on %s not ready after %v: %w; log ends:\n%s", p.name, p.Addr(), readyTimeout, err, p.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill sends SIGKILL to the server's PID and reaps it; the data directory stays, so
// Start brings it back with whatever it had persisted. No-op when not running.
func (p *Proc) Kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.killLocked()
}

func (p *Proc) killLocked() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill() // SIGKILL also ends a stopped process
	_ = p.cmd.Wait()
	p.log.Close()
	p.cmd, p.log = nil, nil
}

// Restart is Kill then Start.
func (p *Proc) Restart() error {
	p.Kill()
	return p.Start()
}

// Pause stops the server with SIGSTOP: its connections stay open, and nothing answers.
func (p *Proc) Pause() error { return p.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (p *Proc) Resume() error { return p.signal(syscall.SIGCONT) }

func (p *Proc) signal(sig os.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("%s on port %d is not running", p.name, p.port)
	}
	return p.cmd.Process.Signal(sig)
}

// PID returns the process id, or 0 when not running.
func (p *Proc) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Port returns the server's port; it stays the same across restarts.
func (p *Proc) Port() int { return p.port }

// Addr returns "127.0.0.1:<port>".
func (p *Proc) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }

// URL returns "nats://127.0.0.1:<port>", the client URL of a nats-server.
func (p *Proc) URL() string { return "nats://" + p.Addr() }

// Dir returns the server's directory (data and log).
func (p *Proc) Dir() string { return p.dir }

// Log returns the end of the server's log, for a failing test's message.
func (p *Proc) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logTail()
}

func (p *Proc) logTail() string {
	b, err := os.ReadFile(filepath.Join(p.dir, p.name+".log"))
	if err != nil {
		return err.Error()
	}
	const keep = 4096
	if len(b) > keep {
		b = b[len(b)-keep:]
	}
	return string(b)
}

func redisReady(p *Proc) error {
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	return c.Ping(ctx).Err() // a server still loading its data answers LOADING
}

func natsReady(p *Proc) error {
	conn, err := net.DialTimeout("tcp", p.Addr(), 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if !strings.HasPrefix(line, "INFO ") {
		return fmt.Errorf("no INFO greeting")
	}
	return nil
}
