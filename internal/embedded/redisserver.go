package embedded

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// RedisServer is a redis-server process started by StartRedisServer or
// StartRedisSentinel. Stop kills that process (by its own PID, never by name).
type RedisServer struct {
	// Addr is the server's loopback address, 127.0.0.1:<port>.
	Addr string
	// Port is the port it listens on: TLS when started with TLS arguments.
	Port int

	cmd    *exec.Cmd
	drain  sync.WaitGroup
	dir    string
	ownDir bool
	once   sync.Once
}

// readyTimeout bounds the wait for a spawned server to say it accepts connections.
const readyTimeout = 10 * time.Second

// StartRedisServer starts redis-server (from PATH) on a free loopback port, without
// persistence, working in dir ("" for a temp dir that Stop removes), with the extra
// arguments args (later arguments override earlier ones, as in redis.conf). It
// returns once the server logs that it accepts connections.
//
// When args name a --tls-cert-file, the port serves TLS and the plain port is off.
// The error wraps exec.ErrNotFound when redis-server is not on PATH.
func StartRedisServer(dir string, args ...string) (*RedisServer, error) {
	tls := slices.Contains(args, "--tls-cert-file")
	return startRedisProcess(dir, "", func() (int, []string, error) {
		port, err := freePort()
		if err != nil {
			return 0, nil, err
		}
		argv := []string{"--port", strconv.Itoa(port)}
		if tls {
			argv = []string{"--port", "0", "--tls-port", strconv.Itoa(port)}
		}
		argv = append(argv, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
		return port, append(argv, args...), nil
	})
}

// StartRedisSentinel starts a redis-server in sentinel mode on a free loopback port,
// monitoring the primary at primaryAddr under masterName with the given quorum, and
// deciding a primary is down after downAfter. dir is as for StartRedisServer.
func StartRedisSentinel(dir, masterName, primaryAddr string, quorum int, downAfter time.Duration) (*RedisServer, error) {
	host, port, err := net.SplitHostPort(primaryAddr)
	if err != nil {
		return nil, err
	}
	return startRedisProcess(dir, "sentinel.conf", func() (int, []string, error) {
		p, err := freePort()
		if err != nil {
			return 0, nil, err
		}
		conf := fmt.Sprintf("port %d\nbind 127.0.0.1\n"+
			"sentinel monitor %s %s %s %d\n"+
			"sentinel down-after-milliseconds %s %d\n"+
			"sentinel failover-timeout %s 10000\n",
			p, masterName, host, port, quorum, masterName, downAfter.Milliseconds(), masterName)
		return p, []string{conf}, nil
	})
}

// startRedisProcess starts redis-server with what build returns: its port and either
// its arguments or, when confName is set (sentinel mode), the text of its config
// file. A port taken meanwhile by someone else is retried on a new one.
func startRedisProcess(dir, confName string, build func() (int, []string, error)) (*RedisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("embedded redis: %w", err)
	}
	ownDir := dir == ""
	if ownDir {
		if dir, err = os.MkdirTemp("", "dedup-redis-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		port, args, err := build()
		if err != nil {
			return nil, errors.Join(err, removeIf(ownDir, dir))
		}
		argv := append([]string{"--dir", dir}, args...)
		if confName != "" {
			conf := filepath.Join(dir, confName)
			if err := os.WriteFile(conf, []byte(args[0]), 0o644); err != nil {
				return nil, errors.Join(err, removeIf(ownDir, dir))
			}
			argv = []string{conf, "--sentinel", "--dir", dir}
		}
		s, err := spawn(bin, argv, port, dir, ownDir)
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, errPortTaken) || attempt == 3 {
			return nil, errors.Join(err, removeIf(ownDir, dir))
		}
	}
}

var errPortTaken = errors.New("port taken")

func removeIf(yes bool, dir string) error {
	if yes {
		return os.RemoveAll(dir)
	}
	return nil
}

// spawn runs the process and reads its log (stdout) until it says it is ready
// ("Ready to accept connections", or for a sentinel its ID, logged once listening),
// or exits.
func spawn(bin string, argv []string, port int, dir string, ownDir bool) (*RedisServer, error) {
	cmd := exec.Command(bin, argv...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("embedded redis: start: %w", err)
	}
	s := &RedisServer{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Port: port, cmd: cmd, dir: dir, ownDir: ownDir}
	ready := make(chan struct{})
	var mu sync.Mutex
	var tail []string // the last lines, for the error should it never get ready
	s.drain.Add(1)
	go func() {
		defer s.drain.Done()
		sc := bufio.NewScanner(out)
		signalled := false
		for sc.Scan() { // read to the end so that the server never blocks on a full pipe
			line := sc.Text()
			if signalled {
				continue
			}
			mu.Lock()
			tail = append(tail, line)
			if len(tail) > 8 {
				tail = tail[1:]
			}
			mu.Unlock()
			if strings.Contains(line, "Ready to accept connections") || strings.Contains(line, "Sentinel ID is") {
				signalled = true
				close(ready)
			}
		}
	}()
	exited := make(chan struct{})
	go func() { // the drain ends when the process does; then say so
		s.drain.Wait()
		close(exited)
	}()
	select {
	case <-ready:
		return s, nil
	case <-exited:
	case <-time.After(readyTimeout):
	}
	s.kill()
	<-exited
	mu.Lock()
	log := strings.Join(tail, "\n")
	mu.Unlock()
	err = fmt.Errorf("embedded redis: redis-server on port %d did not get ready:\n%s", port, log)
	if strings.Contains(log, "Address already in use") {
		err = fmt.Errorf("%w: %w", errPortTaken, err)
	}
	return nil, err
}

func (s *RedisServer) kill() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.drain.Wait()
}

// Stop kills the server's process, waits for it, and removes its directory if it
// made it. Idempotent.
func (s *RedisServer) Stop() {
	s.once.Do(func() {
		s.kill()
		_ = removeIf(s.ownDir, s.dir)
	})
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
