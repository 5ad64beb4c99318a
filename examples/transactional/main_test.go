package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/dedupkit/dedupkit/internal/testenv"
)

// TestMain fails the package if a run leaves a goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestRunEmbedded runs the example bare: in-process NATS, miniredis, SQLite.
func TestRunEmbedded(t *testing.T) {
	check(t, runExample(t, "-nats=", "-redis=", "-postgres=", "-orders", "600"), 600)
}

// TestRunServers runs it against DEDUP_NATS_URL, DEDUP_REDIS_ADDR and
// DEDUP_POSTGRES_URL, and checks it left none of its tables behind.
func TestRunServers(t *testing.T) {
	natsURL, redisAddr := os.Getenv("DEDUP_NATS_URL"), os.Getenv("DEDUP_REDIS_ADDR")
	if natsURL == "" || redisAddr == "" {
		testenv.SkipNoServer(t, "DEDUP_NATS_URL and DEDUP_REDIS_ADDR are not both set")
	}
	pg := testenv.PostgresURL(t)
	check(t, runExample(t, "-nats", natsURL, "-redis", redisAddr, "-postgres", pg, "-orders", "600"), 600)
}

func runExample(t *testing.T, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	err := run(context.Background(), args, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// check reads the summary: every order billed once, duplicates answered by each tier,
// the database's markers among them (Redis lost its records halfway).
func check(t *testing.T, out string, orders int) {
	t.Helper()
	if !strings.Contains(out, "ok: each of "+strconv.Itoa(orders)+" orders billed exactly once") {
		t.Fatal("no ok line")
	}
	m := regexp.MustCompile(`billed (\d+), duplicates (\d+) \(local tier \d+, Redis \d+, database markers (\d+)\)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatal("no summary line")
	}
	billed, _ := strconv.Atoi(m[1])
	fromDB, _ := strconv.Atoi(m[3])
	if billed != orders || fromDB == 0 {
		t.Errorf("billed %d, duplicates from the markers %d; want %d and some", billed, fromDB, orders)
	}
}
