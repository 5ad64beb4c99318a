package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dedupkit/dedupkit/internal/testenv"
)

// TestMain fails the package if a run leaves a goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestRunEmbedded runs the example on the in-process servers, whatever the environment.
func TestRunEmbedded(t *testing.T) {
	out := runExample(t, "-nats=", "-redis=")
	checkSummary(t, out)
}

// TestRunServers runs it against DEDUP_NATS_URL and DEDUP_REDIS_ADDR, then checks that
// it left neither its stream nor its records behind.
func TestRunServers(t *testing.T) {
	natsURL, redisAddr := os.Getenv("DEDUP_NATS_URL"), os.Getenv("DEDUP_REDIS_ADDR")
	if natsURL == "" || redisAddr == "" {
		testenv.SkipNoServer(t, "DEDUP_NATS_URL and DEDUP_REDIS_ADDR are not both set")
	}
	nc, err := natsgo.Connect(natsURL)
	if err != nil {
		testenv.SkipNoServer(t, "nats at %s: %v", natsURL, err)
	}
	defer nc.Close()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		testenv.SkipNoServer(t, "redis at %s: %v", redisAddr, err)
	}

	out := runExample(t, "-nats", natsURL, "-redis", redisAddr)
	checkSummary(t, out)

	m := regexp.MustCompile(`(?m)^run ([0-9a-f]+)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatal("no run id in the output")
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream := "DEDUPKIT_EX_" + strings.ToUpper(m[1])
	if _, err := js.Stream(ctx, stream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("stream %s still there after the run (err %v)", stream, err)
	}
	keys, _, err := rdb.Scan(ctx, 0, "dedupkit-ex-"+m[1]+":*", 1000).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) > 0 {
		t.Errorf("%d redis records left behind under dedupkit-ex-%s", len(keys), m[1])
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{{"-orders", "0"}, {"-instances", "0"}, {"-timeout", "0s"}, {"extra"}} {
		if err := run(context.Background(), args, new(bytes.Buffer)); err == nil {
			t.Errorf("run %q: no error", args)
		}
	}
}

const testOrders = 400

func runExample(t *testing.T, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	args = append(args, "-orders", strconv.Itoa(testOrders), "-instances", "2", "-timeout", "40s")
	err := run(context.Background(), args, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	return out.String()
}

var (
	handlerRow = regexp.MustCompile(`(?m)^(inventory|email)((?: +\d+){9})$`)
	ackRow     = regexp.MustCompile(`(?m)^(inventory|email)((?: +\d+){7})$`)
	lateRow    = regexp.MustCompile(`(?m)^republished +(\d+) after the duplicate window, (\d+) stored$`)
)

// checkSummary checks that the printed summary shows duplicates injected and skipped.
func checkSummary(t *testing.T, out string) {
	t.Helper()
	if !strings.Contains(out, "\nok: ") {
		t.Error("no ok line")
	}
	if m := lateRow.FindStringSubmatch(out); m == nil || m[2] == "0" {
		t.Errorf("no republished message was stored: %q", m)
	}
	rows := table(t, handlerRow, out)
	acks := table(t, ackRow, out)
	for _, h := range []string{"inventory", "email"} {
		r, a := rows[h], acks[h]
		if r == nil || a == nil {
			t.Fatalf("%s: missing from the summary", h)
		}
		// deliveries redelivered runs processed failed panicked dup-local dup-redis in-progress
		deliveries, redelivered, runs, processed, failed, panicked, local, store :=
			r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]
		if processed != testOrders {
			t.Errorf("%s: processed %d, want %d", h, processed, testOrders)
		}
		if redelivered == 0 || failed == 0 || panicked == 0 {
			t.Errorf("%s: redelivered %d, failed %d, panicked %d: want all nonzero", h, redelivered, failed, panicked)
		}
		if local == 0 || store == 0 {
			t.Errorf("%s: duplicates local %d, redis %d: want both nonzero", h, local, store)
		}
		if runs != processed+failed+panicked {
			t.Errorf("%s: runs %d != processed %d + failed %d + panicked %d", h, runs, processed, failed, panicked)
		}
		// ack nak-with-delay nak term none acks-lost ack-errors
		ack, nakDelay, nak, term, none, lost := a[0], a[1], a[2], a[3], a[4], a[5]
		if lost == 0 || nakDelay == 0 || nak == 0 {
			t.Errorf("%s: acks lost %d, nak-with-delay %d, nak %d: want all nonzero", h, lost, nakDelay, nak)
		}
		if term != 0 {
			t.Errorf("%s: %d terminated", h, term)
		}
		if total := ack + nakDelay + nak + term + none; total != deliveries {
			t.Errorf("%s: %d acknowledgements for %d deliveries", h, total, deliveries)
		}
	}
}

func table(t *testing.T, re *regexp.Regexp, out string) map[string][]uint64 {
	t.Helper()
	rows := map[string][]uint64{}
	for _, m := range re.FindAllStringSubmatch(out, -1) {
		var vals []uint64
		for _, f := range strings.Fields(m[2]) {
			v, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			vals = append(vals, v)
		}
		rows[m[1]] = vals
	}
	return rows
}
