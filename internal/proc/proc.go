// Package proc runs server processes from binaries on PATH (Proc): on a loopback
// port of their own, each signalled by its own PID, never by name. It is the
// machinery under internal/embedded's spawned servers and dedupkittest's Redis
// Cluster, and imports nothing of this repository, so that both can use it.
package proc

import (
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
	"time"
)

// Proc is a server process started from a binary on PATH (redis-server,
// nats-server) by Spawn: on a loopback port of its own, with its data and its log
// file (<binary>.log) in a directory. It can be killed (SIGKILL), paused (SIGSTOP),
// resumed, and started again on the same port, directory and arguments. Every
// signal goes to its PID; nothing is ever killed by name. On Linux the kernel kills it should its owner die
// first (DieWithParent). Safe for concurrent use.
type Proc struct {
	name   string // the binary's name, and its log file's
	bin    string
	argv   []string
	port   int
	dir    string
	ownDir bool
	// ready reports whether the process serves yet, given its log since this start.
	ready func(p *Proc, log string) error

	mu     sync.Mutex
	cmd    *exec.Cmd
	log    *os.File
	exited chan struct{} // closed once cmd is reaped
}

// readyTimeout bounds a server's start (a Redis loading its AOF included).
const readyTimeout = 10 * time.Second

// errPortTaken marks a start that failed because another process took the port
// between FreePort and the server's bind.
var errPortTaken = errors.New("port taken")

// Spawn starts the binary name in dir ("" for a temp dir that Stop removes)
// with the port and arguments build returns for that dir, and waits until ready
// accepts it. A port taken meanwhile by someone else is retried on a new one. The
// error wraps exec.ErrNotFound when the binary is not on PATH.
func Spawn(name, dir string, ready func(*Proc, string) error, build func(dir string) (port int, argv []string, err error)) (*Proc, error) {
	bin, err := exec.LookPath(name)
	if err != nil {
		return nil, fmt.Errorf("proc: %w", err)
	}
	ownDir := dir == ""
	if ownDir {
		if dir, err = os.MkdirTemp("", "dedup-"+name+"-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		port, argv, err := build(dir)
		if err != nil {
			return nil, errors.Join(err, removeIf(ownDir, dir))
		}
		p := &Proc{name: name, bin: bin, argv: argv, port: port, dir: dir, ownDir: ownDir, ready: ready}
		err = p.Start()
		if err == nil {
			return p, nil
		}
		if !errors.Is(err, errPortTaken) || attempt == 3 {
			return nil, errors.Join(err, removeIf(ownDir, dir))
		}
	}
}

// Start starts the server again after Kill: same binary, port, directory and
// arguments. It returns once the server is ready, or an error holding its log since
// this start when it exits first or is not ready within 10 s. Starting a running
// server is an error.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("proc: %s on port %d is already running", p.name, p.port)
	}
	log, err := os.OpenFile(p.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	from, err := log.Seek(0, io.SeekEnd) // what earlier starts wrote does not count
	if err != nil {
		log.Close()
		return err
	}
	cmd := exec.Command(p.bin, p.argv...)
	cmd.Stdout, cmd.Stderr = log, log // files: no copying goroutine to stop
	DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("proc: start %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	p.cmd, p.log, p.exited = cmd, log, exited

	deadline := time.Now().Add(readyTimeout)
	for {
		err = p.ready(p, p.logFrom(from))
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			err = errors.New("it exited")
		case <-time.After(20 * time.Millisecond):
			if time.Now().Before(deadline) {
				continue
			}
			err = fmt.Errorf("not ready after %v: %w", readyTimeout, err)
		}
		p.killLocked()
		text := p.logFrom(from)
		err = fmt.Errorf("proc: %s on %s did not get ready: %w; its log:\n%s", p.name, p.Addr(), err, text)
		if strings.Contains(strings.ToLower(text), "address already in use") {
			err = fmt.Errorf("%w: %w", errPortTaken, err)
		}
		return err
	}
}

// Kill sends SIGKILL to the server's PID and reaps it; the directory stays, so Start
// brings it back with whatever it had persisted. No-op when not running.
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
	<-p.exited
	p.log.Close()
	p.cmd, p.log, p.exited = nil, nil, nil
}

// Stop is Kill, then removes the server's directory if it was started with dir ""
// (a temp dir of its own). Idempotent.
func (p *Proc) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.killLocked()
	_ = removeIf(p.ownDir, p.dir)
}

// Restart is Kill then Start.
func (p *Proc) Restart() error {
	p.Kill()
	return p.Start()
}

// Pause stops the server with SIGSTOP: its connections stay open, and nothing
// answers. The error wraps errors.ErrUnsupported where there is no SIGSTOP.
func (p *Proc) Pause() error { return p.signal(sigStop) }

// Resume continues a paused server (SIGCONT).
func (p *Proc) Resume() error { return p.signal(sigCont) }

func (p *Proc) signal(sig os.Signal) error {
	if sig == nil {
		return fmt.Errorf("proc: pause and resume: %w", errors.ErrUnsupported)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("proc: %s on port %d is not running", p.name, p.port)
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

// Port returns the server's port (the TLS port of a TLS-only Redis); it stays the
// same across restarts.
func (p *Proc) Port() int { return p.port }

// Addr returns "127.0.0.1:<port>".
func (p *Proc) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }

// URL returns "nats://127.0.0.1:<port>", the client URL of a nats-server.
func (p *Proc) URL() string { return "nats://" + p.Addr() }

// Dir returns the server's directory (data and log).
func (p *Proc) Dir() string { return p.dir }

// Log returns the end of the server's log (its last 4 KiB, over every start), for a
// failing test's message.
func (p *Proc) Log() string { return p.logFrom(0) }

func (p *Proc) logPath() string { return filepath.Join(p.dir, p.name+".log") }

// logFrom returns the log from byte offset from on, at most its last 4 KiB.
func (p *Proc) logFrom(from int64) string {
	f, err := os.Open(p.logPath())
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	const keep = 4096
	if st, err := f.Stat(); err == nil && st.Size()-from > keep {
		from = st.Size() - keep
	}
	b, err := io.ReadAll(io.NewSectionReader(f, from, 1<<62))
	if err != nil {
		return err.Error()
	}
	return string(b)
}

func removeIf(yes bool, dir string) error {
	if yes {
		return os.RemoveAll(dir)
	}
	return nil
}

// FreePort returns a loopback port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
