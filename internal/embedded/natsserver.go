package embedded

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/dedupkit/dedupkit/internal/proc"
)

// StartNATSServer starts nats-server (from PATH) with JetStream on a free loopback
// port, storing under dir/js (dir "" for a temp dir that Stop removes), with the
// extra arguments args, and returns once it greets a client. For an in-process
// server, see StartNATS. The error wraps exec.ErrNotFound when nats-server is not on
// PATH.
func StartNATSServer(dir string, args ...string) (*Proc, error) {
	return proc.Spawn("nats-server", dir, natsReady, func(dir string) (int, []string, error) {
		port, err := proc.FreePort()
		if err != nil {
			return 0, nil, err
		}
		argv := []string{"-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", filepath.Join(dir, "js")}
		return port, append(argv, args...), nil
	})
}

// natsReady reports whether the server sends a client its INFO greeting.
func natsReady(p *proc.Proc, _ string) error {
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
