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

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedupkittest"
	dnats "github.com/dedupkit/dedupkit/nats"
)

// TestMain fails the package if a run leaves a goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestJobRunsEveryOrderOnceOnEmbeddedServers(t *testing.T) {
	checkJob(t, "-nats=", "-redis=")
}

// On real servers the job runs the same, and deletes its stream and its records.
func TestJobRunsOnRealServersAndLeavesNothingBehind(t *testing.T) {
	natsURL, redisAddr := os.Getenv("DEDUP_NATS_URL"), os.Getenv("DEDUP_REDIS_ADDR")
	if natsURL == "" || redisAddr == "" {
		dedupkittest.SkipNoServer(t, "DEDUP_NATS_URL and DEDUP_REDIS_ADDR are not both set")
	}
	nc, err := natsgo.Connect(natsURL)
	if err != nil {
		dedupkittest.SkipNoServer(t, "nats at %s: %v", natsURL, err)
	}
	defer nc.Close()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		dedupkittest.SkipNoServer(t, "redis at %s: %v", redisAddr, err)
	}

	id := runID(t, checkJob(t, "-nats", natsURL, "-redis", redisAddr))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream := "DEDUPKIT_EX_" + strings.ToUpper(id)
	if _, err := js.Stream(ctx, stream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("stream %s still there after the run (err %v)", stream, err)
	}
	keys, _, err := rdb.Scan(ctx, 0, "dedupkit-ex-"+id+":*", 1000).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) > 0 {
		t.Errorf("%d redis records left behind under dedupkit-ex-%s", len(keys), id)
	}
}

func TestJobRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-orders", "0"}, {"-instances", "0"}, {"-timeout", "0s"}, {"extra"},
		{"-redis-cluster=,"}, {"-redis-cluster=a:1,"}, {"-redis", "127.0.0.1:6379", "-redis-cluster", "127.0.0.1:7000"},
	} {
		if _, err := run(context.Background(), args, new(bytes.Buffer)); err == nil {
			t.Errorf("run %q: no error", args)
		}
	}
}

const testOrders = 400

// checkJob runs the job with 400 orders on two instances and checks, beyond its own
// verdict, that every kind of duplicate was injected and answered, and that every
// delivery was acknowledged once.
func checkJob(t *testing.T, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	args = append(args, "-orders", strconv.Itoa(testOrders), "-instances", "2", "-timeout", "40s")
	tl, err := run(context.Background(), args, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if !strings.Contains(out.String(), "\nok: ") {
		t.Error("no ok line")
	}
	if want := uint64(testOrders + testOrders/10); tl.info.Delivered.Stream != want {
		t.Errorf("%d messages stored, want %d: the republished orders were not all stored again", tl.info.Delivered.Stream, want)
	}

	var processed, failed, panicked, local, store uint64
	for _, h := range tl.handlers {
		st := h.Stats()
		processed, failed, panicked = processed+st.Count(dedup.Processed), failed+st.Count(dedup.Failed), panicked+st.Count(dedup.Panicked)
		local, store = local+st.LocalDuplicates, store+st.StoreDuplicates
	}
	if processed != testOrders {
		t.Errorf("processed %d, want %d", processed, testOrders)
	}
	if failed == 0 || panicked == 0 || tl.crashes.Load() == 0 {
		t.Errorf("failed %d, panicked %d, crashed before an ack %d: want all nonzero", failed, panicked, tl.crashes.Load())
	}
	if local == 0 || store == 0 {
		t.Errorf("duplicates local %d, redis %d: want both nonzero", local, store)
	}
	if runs := uint64(tl.runs.Load()); runs != processed+failed+panicked {
		t.Errorf("runs %d != processed %d + failed %d + panicked %d", runs, processed, failed, panicked)
	}

	var acts [dnats.ActTerm + 1]uint64
	for _, a := range tl.adapters {
		for act := range acts {
			acts[act] += a.Stats().Count(dnats.Action(act))
		}
	}
	if acts[dnats.ActNakWithDelay] == 0 || acts[dnats.ActNak] == 0 {
		t.Errorf("nak-with-delay %d, nak %d: want both nonzero", acts[dnats.ActNakWithDelay], acts[dnats.ActNak])
	}
	if acts[dnats.ActTerm] != 0 {
		t.Errorf("%d terminated", acts[dnats.ActTerm])
	}
	total := uint64(0)
	for _, n := range acts {
		total += n
	}
	if deliveries := tl.info.Delivered.Consumer; total != deliveries {
		t.Errorf("%d acknowledgements for %d deliveries", total, deliveries)
	}
	if tl.info.Delivered.Consumer <= tl.info.Delivered.Stream {
		t.Errorf("%d deliveries of %d messages: nothing was redelivered", tl.info.Delivered.Consumer, tl.info.Delivered.Stream)
	}
	return out.String()
}

func runID(t *testing.T, out string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^run ([a-z2-7]+) on `).FindStringSubmatch(out)
	if m == nil {
		t.Fatal("no run id in the output")
	}
	return m[1]
}
