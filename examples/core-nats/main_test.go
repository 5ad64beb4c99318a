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

	"github.com/dedupkit/dedupkit/internal/testenv"
)

// TestMain fails the package if a run leaves a goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestRunEmbedded(t *testing.T) {
	checkRun(t, "-nats=", "-redis=")
}

// TestRunServers runs against DEDUP_NATS_URL and DEDUP_REDIS_ADDR and checks that the
// run's records were deleted.
func TestRunServers(t *testing.T) {
	natsURL, redisAddr := os.Getenv("DEDUP_NATS_URL"), os.Getenv("DEDUP_REDIS_ADDR")
	if natsURL == "" || redisAddr == "" {
		testenv.SkipNoServer(t, "DEDUP_NATS_URL and DEDUP_REDIS_ADDR are not both set")
	}
	out := checkRun(t, "-nats", natsURL, "-redis", redisAddr)
	m := regexp.MustCompile(`(?m)^run ([0-9a-f]+)$`).FindStringSubmatch(out)
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

func TestFlags(t *testing.T) {
	for _, args := range [][]string{{"-events", "0"}, {"-subscribers", "0"}, {"-timeout", "0s"}, {"extra"}} {
		if err := run(context.Background(), args, new(bytes.Buffer)); err == nil {
			t.Errorf("run %q: no error", args)
		}
	}
}

var totalRow = regexp.MustCompile(`(?m)^total((?: +\d+){6})$`)

// checkRun runs the example with 500 ids and checks the totals: every id ran once, and
// the repeats were dropped by both tiers.
func checkRun(t *testing.T, args ...string) string {
	t.Helper()
	const events = 500
	var out bytes.Buffer
	err := run(context.Background(), append(args, "-events", strconv.Itoa(events), "-timeout", "20s"), &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	m := totalRow.FindStringSubmatch(out.String())
	if m == nil {
		t.Fatal("no total row")
	}
	var received, ran, dropped, local, store, other int
	if _, err := fmt.Sscan(strings.TrimSpace(m[1]), &received, &ran, &dropped, &local, &store, &other); err != nil {
		t.Fatal(err)
	}
	if ran != events || dropped != received-events || other != 0 {
		t.Errorf("received %d, ran %d, dropped %d, other %d: want ran %d and the rest dropped", received, ran, dropped, other, events)
	}
	if local == 0 || store == 0 || local+store != dropped {
		t.Errorf("duplicates local %d + redis %d != dropped %d, or a tier never answered", local, store, dropped)
	}
	return out.String()
}
