package dedup

import (
	"testing"

	"github.com/dedupkit/dedupkit/internal/testenv"
)

// spawnRedis starts a redis-server of our own (testenv.SpawnRedis) with extra
// arguments, and returns its address.
func spawnRedis(t testing.TB, args ...string) string {
	t.Helper()
	return testenv.SpawnRedis(t, args...).Addr()
}
