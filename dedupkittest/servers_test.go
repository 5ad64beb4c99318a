package dedupkittest

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
)

func TestStartServersStartsEmbeddedOnesForEmptyAddresses(t *testing.T) {
	s, err := StartServers("", "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := s.String(); !strings.Contains(got, "(in-process)") || !strings.Contains(got, "(embedded miniredis)") {
		t.Errorf("String() = %q, want both servers named embedded", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	nc, err := natsgo.Connect(s.NATSURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}}); err != nil {
		t.Fatalf("the NATS server has no JetStream: %v", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: s.RedisAddr})
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	nc.Close()
	rdb.Close()
	s.Close()
	s.Close()
	for _, addr := range []string{strings.TrimPrefix(s.NATSURL, "nats://"), s.RedisAddr} {
		if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			conn.Close()
			t.Errorf("%s still accepts connections after Close", addr)
		}
	}
}

func TestStartServersKeepsTheGivenAddressesAndStartsNothing(t *testing.T) {
	s, err := StartServers("nats://127.0.0.1:1", "127.0.0.1:2")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.NATSURL != "nats://127.0.0.1:1" || s.RedisAddr != "127.0.0.1:2" {
		t.Errorf("got %s and %s, want the given addresses", s.NATSURL, s.RedisAddr)
	}
	if got, want := s.String(), "nats nats://127.0.0.1:1, redis 127.0.0.1:2"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

func TestStartNATSRemovesTheTempDirItMadeAtClose(t *testing.T) {
	n, err := StartNATS("")
	if err != nil {
		t.Fatal(err)
	}
	dir := n.tmpDir
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("store dir: %v", err)
	}
	n.Close()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s still there after Close (err %v)", dir, err)
	}
}

func TestStartNATSLeavesAGivenDirInPlace(t *testing.T) {
	dir := t.TempDir()
	n, err := StartNATS(dir)
	if err != nil {
		t.Fatal(err)
	}
	n.Close()
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("the given dir went at Close: %v", err)
	}
}

func TestDeleteKeysDeletesOnlyThePrefixsKeys(t *testing.T) {
	c := startRedisClient(t)
	ctx := context.Background()
	var keep []string
	for i := range 2500 { // more than one SCAN page and one UNLINK pipeline
		if err := c.Set(ctx, "run:"+strconv.Itoa(i), "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{"runner:1", "other:run:1", "run"} {
		keep = append(keep, k)
		if err := c.Set(ctx, k, "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := DeleteKeys(ctx, c, "run"); err != nil {
		t.Fatal(err)
	}
	left, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(slices.Sorted(slices.Values(left))) != fmt.Sprint(slices.Sorted(slices.Values(keep))) {
		t.Errorf("left %v, want %v", left, keep)
	}
}
