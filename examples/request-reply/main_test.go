package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dedupkit/dedupkit/dedupkittest"
	dnats "github.com/dedupkit/dedupkit/nats"
)

// TestMain fails the package if a run leaves a goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestRetriedRequestsCreateOneOrderOnEmbeddedServers(t *testing.T) {
	checkRun(t, "-nats=", "-redis=")
}

// On real servers it runs the same, and deletes the run's records.
func TestRetriedRequestsOnRealServersLeaveNoRecords(t *testing.T) {
	natsURL, redisAddr := os.Getenv("DEDUP_NATS_URL"), os.Getenv("DEDUP_REDIS_ADDR")
	if natsURL == "" || redisAddr == "" {
		dedupkittest.SkipNoServer(t, "DEDUP_NATS_URL and DEDUP_REDIS_ADDR are not both set")
	}
	out := checkRun(t, "-nats", natsURL, "-redis", redisAddr)
	m := regexp.MustCompile(`(?m)^run ([a-z2-7]+) on `).FindStringSubmatch(out)
	if m == nil {
		t.Fatal("no run id in the output")
	}
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	keys, _, err := rdb.Scan(ctx, 0, "dedupkit-rr-"+m[1]+":*", 1000).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) > 0 {
		t.Errorf("%d redis records left behind", len(keys))
	}
}

func TestRequestReplyRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-requests", "0"}, {"-clients", "0"}, {"-timeout", "0s"}, {"extra"}} {
		if _, err := run(context.Background(), args, new(bytes.Buffer)); err == nil {
			t.Errorf("run %q: no error", args)
		}
	}
}

// checkRun runs the example with 120 requests: it must succeed (every request created
// one order, every answer to it the same), the retries must have happened (timeouts
// and lost replies) and been answered with stored replies, and fn ran once a request.
func checkRun(t *testing.T, args ...string) string {
	t.Helper()
	const requests = 120
	var out bytes.Buffer
	res, err := run(context.Background(), append(args, "-requests", strconv.Itoa(requests), "-timeout", "60s"), &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if res.timeouts.Load() == 0 || res.lost.Load() == 0 {
		t.Errorf("timeouts %d, replies lost %d: the retries were not exercised", res.timeouts.Load(), res.lost.Load())
	}
	var ran, replayed uint64
	for _, r := range res.repliers {
		ran += r.Stats().Count(dnats.ReplyRun)
		replayed += r.Stats().Count(dnats.ReplyStored)
	}
	if ran != requests || replayed == 0 {
		t.Errorf("fn ran %d times for %d requests, %d stored replies replayed", ran, requests, replayed)
	}
	if !strings.Contains(out.String(), fmt.Sprintf("ok: each of %d requests created exactly one order", requests)) {
		t.Error("no ok line")
	}
	return out.String()
}
