package testenv

import (
	"errors"
	"os/exec"
	"testing"

	"github.com/dedupkit/dedupkit/internal/embedded"
)

// SpawnRedis is embedded.StartRedisServer for one test: the server's directory is
// under t.TempDir(), a missing redis-server skips the test (SkipNoServer), and
// cleanup kills it.
func SpawnRedis(t testing.TB, args ...string) *embedded.Proc {
	t.Helper()
	return Spawn(t, func(dir string) (*embedded.Proc, error) { return embedded.StartRedisServer(dir, args...) })
}

// SpawnNATS is embedded.StartNATSServer for one test: the server's directory is
// under t.TempDir(), a missing nats-server skips the test (SkipNoServer), and
// cleanup kills it.
func SpawnNATS(t testing.TB, args ...string) *embedded.Proc {
	t.Helper()
	return Spawn(t, func(dir string) (*embedded.Proc, error) { return embedded.StartNATSServer(dir, args...) })
}

// Spawn runs start (an embedded.Start…Server function) for one test, in a directory
// under t.TempDir(): an error wrapping exec.ErrNotFound (the binary is not on PATH)
// skips the test (SkipNoServer), any other fails it, and cleanup kills the process.
func Spawn(t testing.TB, start func(dir string) (*embedded.Proc, error)) *embedded.Proc {
	t.Helper()
	p, err := start(t.TempDir())
	if errors.Is(err, exec.ErrNotFound) {
		SkipNoServer(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	// Registered after t.TempDir, so it runs before the directory is removed.
	t.Cleanup(p.Kill)
	return p
}
