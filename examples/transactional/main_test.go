package main

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedupkittest"
)

// TestMain fails the package if a run leaves a goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Bare (in-process NATS, miniredis, SQLite), every order is billed once.
func TestOrdersAreBilledOnceOnSQLite(t *testing.T) {
	check(t, 600, "-nats=", "-redis=", "-postgres=")
}

// On the real servers and PostgreSQL, every order is billed once.
func TestOrdersAreBilledOnceOnPostgreSQL(t *testing.T) {
	natsURL, redisAddr := os.Getenv("DEDUP_NATS_URL"), os.Getenv("DEDUP_REDIS_ADDR")
	if natsURL == "" || redisAddr == "" {
		dedupkittest.SkipNoServer(t, "DEDUP_NATS_URL and DEDUP_REDIS_ADDR are not both set")
	}
	check(t, 600, "-nats", natsURL, "-redis", redisAddr, "-postgres", dedupkittest.PostgresURL(t))
}

func TestTransactionalRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-orders", "1"}, {"extra"}} {
		if _, err := run(context.Background(), args, new(bytes.Buffer)); err == nil {
			t.Errorf("run %q: no error", args)
		}
	}
}

// check runs the example and reads its handlers' counters: every order billed once,
// and duplicates answered by the database's markers among them (Redis lost its
// records halfway).
func check(t *testing.T, orders int, args ...string) {
	t.Helper()
	var out bytes.Buffer
	handlers, err := run(context.Background(), append(args, "-orders", strconv.Itoa(orders)), &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "ok: each of "+strconv.Itoa(orders)+" orders billed exactly once") {
		t.Fatal("no ok line")
	}
	var billed, fromDB uint64
	for _, h := range handlers {
		billed += h.Stats().Count(dedup.Processed)
		fromDB += h.Stats().DatabaseDuplicates
	}
	if billed != uint64(orders) || fromDB == 0 {
		t.Errorf("billed %d, duplicates from the markers %d; want %d and some", billed, fromDB, orders)
	}
}
