package embedded

import (
	"fmt"
	"sync"
)

// RestartableRedis is a redis-server that can be killed and started again on the
// same port, with the same directory and arguments, so that it comes back with
// whatever it had persisted (start it with --appendonly yes to keep anything). Its
// methods mirror the ones a unified process type would have: Addr, Kill, Start,
// Restart, Stop. Safe for concurrent use.
type RestartableRedis struct {
	addr   string
	port   int
	bin    string
	argv   []string
	dir    string
	ownDir bool

	mu  sync.Mutex
	cur *RedisServer // nil while killed
}

// StartRestartableRedis is StartRedisServer for a server that Kill and Start can
// take down and bring back.
func StartRestartableRedis(dir string, args ...string) (*RestartableRedis, error) {
	s, err := StartRedisServer(dir, args...)
	if err != nil {
		return nil, err
	}
	return &RestartableRedis{
		addr: s.Addr, port: s.Port, bin: s.cmd.Path, argv: s.cmd.Args[1:],
		dir: s.dir, ownDir: s.ownDir, cur: s,
	}, nil
}

// Addr returns "127.0.0.1:<port>"; it stays the same across restarts.
func (r *RestartableRedis) Addr() string { return r.addr }

// Kill sends SIGKILL to the server's PID and reaps it: no shutdown, no last write.
// The directory stays. No-op when not running.
func (r *RestartableRedis) Kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != nil {
		r.cur.kill()
		r.cur = nil
	}
}

// Start starts the server again after Kill and returns once it accepts connections
// (after loading what it persisted). Starting a running server is an error.
func (r *RestartableRedis) Start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != nil {
		return fmt.Errorf("embedded redis: the server on %s is already running", r.addr)
	}
	s, err := spawn(r.bin, r.argv, r.port, r.dir, false)
	if err != nil {
		return err
	}
	r.cur = s
	return nil
}

// Restart is Kill then Start.
func (r *RestartableRedis) Restart() error {
	r.Kill()
	return r.Start()
}

// Stop kills the server and removes its directory if StartRestartableRedis made it.
// Idempotent.
func (r *RestartableRedis) Stop() {
	r.Kill()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ownDir {
		_ = removeIf(true, r.dir)
		r.ownDir = false
	}
}
