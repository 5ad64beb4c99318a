package embedded_test

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/internal/embedded"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// A killed server is gone; started again it has the same port and directory, and
// with them what it had persisted.
func TestProcKillAndStartKeepPortAndData(t *testing.T) {
	s := testenv.SpawnRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	listening(t, s)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	port, pid := s.Port(), s.PID()

	s.Kill()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("the server still answers after Kill")
	}
	if s.PID() != 0 {
		t.Fatalf("PID %d after Kill, want 0", s.PID())
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	listening(t, s)
	if s.Port() != port || s.PID() == pid || s.PID() == 0 {
		t.Fatalf("port %d, PID %d after Start; want port %d and a new PID (was %d)", s.Port(), s.PID(), port, pid)
	}
	if v, err := c.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("k = %q, %v after the restart; want the value persisted before the kill", v, err)
	}
	if err := s.Start(); err == nil {
		t.Fatal("Start of a running server: no error")
	}
	if n := strings.Count(s.Log(), "Ready to accept connections"); n != 2 {
		t.Fatalf("the log says ready %d times, want once per start:\n%s", n, s.Log())
	}
}

// listening fails the test unless the server listens: Start returns only then. A
// bare dial, since go-redis's own dial retries would wait for a server still
// starting.
func listening(t *testing.T, s *embedded.Proc) {
	t.Helper()
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatalf("Start returned before the server listens: %v", err)
	}
	c.Close()
}

// A paused server keeps its port and does not answer; resumed, it answers again.
func TestPausedProcStopsAnsweringUntilResumed(t *testing.T) {
	s := testenv.SpawnRedis(t)
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, ReadTimeout: 300 * time.Millisecond})
	defer c.Close()
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("a paused server answered")
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("after Resume: %v", err)
	}
}

// A nats-server binary serves JetStream on its port, comes back on the same URL
// after Restart, and Stop removes the temp directory it made.
func TestStartNATSServerServesJetStreamAcrossRestarts(t *testing.T) {
	s, err := embedded.StartNATSServer("")
	skipNoBinary(t, err)
	defer s.Stop()
	for range 2 {
		nc, err := natsgo.Connect(s.URL())
		if err != nil {
			t.Fatal(err)
		}
		js, err := nc.JetStream(natsgo.MaxWait(5 * time.Second))
		if err == nil {
			_, err = js.AccountInfo()
		}
		nc.Close()
		if err != nil {
			t.Fatalf("JetStream at %s: %v", s.URL(), err)
		}
		if err := s.Restart(); err != nil {
			t.Fatal(err)
		}
	}
	dir := s.Dir()
	s.Stop()
	s.Stop() // idempotent
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the directory %s is still there after Stop (%v)", dir, err)
	}
}

// A server whose port someone else took meanwhile is started again on another.
func TestStartRetriesATakenPort(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	var tried []int
	s := testenv.Spawn(t, func(dir string) (*embedded.Proc, error) {
		return embedded.StartRedisOn(dir, func() int {
			if len(tried) == 0 {
				tried = append(tried, taken.Addr().(*net.TCPAddr).Port)
			} else {
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				tried = append(tried, l.Addr().(*net.TCPAddr).Port)
				l.Close()
			}
			return tried[len(tried)-1]
		})
	})
	if len(tried) != 2 || s.Port() != tried[1] {
		t.Fatalf("ports tried %v, serving on %d; want the taken one, then another", tried, s.Port())
	}
	if !strings.Contains(strings.ToLower(s.Log()), "address already in use") {
		t.Fatalf("the log does not show the first try's failure:\n%s", s.Log())
	}
}
