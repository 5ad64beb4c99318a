package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedupkittest"
)

// TestMain fails the package if a run leaves a goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestFilterRunsEachIDOnceOnEmbeddedServers(t *testing.T) {
	checkRun(t, "-nats=", "-redis=")
}

// On real servers it runs the same, and deletes the run's records.
func TestFilterRunsOnRealServersAndDeletesItsRecords(t *testing.T) {
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
	keys, _, err := rdb.Scan(ctx, 0, "dedupkit-core-"+m[1]+":*", 1000).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) > 0 {
		t.Errorf("%d redis records left behind", len(keys))
	}
}

func TestFilterRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-events", "0"}, {"-subscribers", "0"}, {"-timeout", "0s"}, {"extra"}} {
		if _, err := run(context.Background(), args, new(bytes.Buffer)); err == nil {
			t.Errorf("run %q: no error", args)
		}
	}
}

// checkRun runs the example with 500 ids and checks the counters: every id ran once,
// the repeats were dropped, by both tiers, and no message ended otherwise.
func checkRun(t *testing.T, args ...string) string {
	t.Helper()
	const events = 500
	var out bytes.Buffer
	res, err := run(context.Background(), append(args, "-events", strconv.Itoa(events), "-timeout", "20s"), &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	var ran, dropped, local, store uint64
	for _, h := range res.handlers {
		st := h.Stats()
		ran, dropped = ran+st.Count(dedup.Processed), dropped+st.Count(dedup.Duplicate)
		local, store = local+st.LocalDuplicates, store+st.StoreDuplicates
	}
	received := res.handled()
	if ran != events || received != uint64(res.sent) || dropped != received-events {
		t.Errorf("sent %d, received %d, ran %d, dropped %d: want ran %d and the rest dropped", res.sent, received, ran, dropped, events)
	}
	if local == 0 || store == 0 || local+store != dropped {
		t.Errorf("duplicates local %d + redis %d != dropped %d, or a tier never answered", local, store, dropped)
	}
	return out.String()
}
