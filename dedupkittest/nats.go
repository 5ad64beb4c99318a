package dedupkittest

import (
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// NATS is an in-process NATS server with JetStream, on a free loopback port.
type NATS struct {
	srv    *server.Server
	tmpDir string // removed at Close: the store dir StartNATS made
	once   sync.Once
}

// StartNATS starts a NATS server with JetStream storing under dir ("" for a temp dir
// that Close removes). It returns once the server accepts clients, at most 10 s.
func StartNATS(dir string) (*NATS, error) {
	n := &NATS{}
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "dedupkit-nats-"); err != nil {
			return nil, err
		}
		n.tmpDir = dir
	}
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: true,
		StoreDir:  dir,
		NoLog:     true,
		NoSigs:    true,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		n.removeDir()
		return nil, fmt.Errorf("dedupkittest: nats: %w", err)
	}
	go srv.Start()
	n.srv = srv
	if !srv.ReadyForConnections(10 * time.Second) {
		n.Close()
		return nil, fmt.Errorf("dedupkittest: nats: not ready after 10s")
	}
	return n, nil
}

// URL returns the client URL, nats://127.0.0.1:<port>.
func (n *NATS) URL() string { return n.srv.ClientURL() }

// Close shuts the server down and waits for it. It is safe to call more than once.
func (n *NATS) Close() {
	n.once.Do(func() {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		n.removeDir()
	})
}

func (n *NATS) removeDir() {
	if n.tmpDir != "" {
		_ = os.RemoveAll(n.tmpDir)
	}
}
