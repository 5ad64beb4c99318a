package dedupkittest

import (
	"fmt"
	"os"
	"testing"
)

// RequireServers reports whether DEDUP_REQUIRE_SERVERS=1, under which a test that
// would skip for want of a server fails instead (CI sets it).
func RequireServers() bool { return os.Getenv("DEDUP_REQUIRE_SERVERS") == "1" }

// SkipNoServer skips t with the reason, or fails it when RequireServers.
func SkipNoServer(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if RequireServers() {
		t.Fatalf("DEDUP_REQUIRE_SERVERS=1 but %s", msg)
	}
	t.Skip(msg)
}

// PostgresURL returns DEDUP_POSTGRES_URL, or skips t (SkipNoServer).
func PostgresURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("DEDUP_POSTGRES_URL")
	if u == "" {
		SkipNoServer(t, "DEDUP_POSTGRES_URL is not set (CI uses postgres://postgres@127.0.0.1:5432/test?sslmode=disable)")
	}
	return u
}
