// Package embedded starts the servers that the examples, the bench program and the
// tests use when no real server is given: in process, a NATS server with JetStream
// and miniredis; as child processes (Proc) of binaries on PATH, a redis-server, a
// sentinel, a Redis Cluster, or a nats-server, each signalled by its own PID. It
// must not import testing; internal/testenv wraps it for tests.
package embedded

import (
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/nats-io/nats-server/v2/server"
)

// NATS is an in-process NATS server with JetStream, on a free loopback port.
type NATS struct {
	srv *server.Server
}

// StartNATS starts a NATS server with JetStream storing under dir (a temp dir).
func StartNATS(dir string) (*NATS, error) {
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
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("embedded nats: not ready after 10s")
	}
	return &NATS{srv: srv}, nil
}

// URL returns the client URL, nats://127.0.0.1:<port>.
func (n *NATS) URL() string { return n.srv.ClientURL() }

// Close shuts the server down and waits for it.
func (n *NATS) Close() {
	n.srv.Shutdown()
	n.srv.WaitForShutdown()
}

// StartRedis starts miniredis on a free loopback port.
func StartRedis() (*miniredis.Miniredis, error) {
	return miniredis.Run()
}
