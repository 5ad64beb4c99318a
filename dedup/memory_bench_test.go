package dedup

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// uuid4 returns a random UUID string, the shape of a typical Idempotency-Key or
// Nats-Msg-Id (36 bytes, a plain key: stored as is).
func uuid4() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// BenchmarkRecordMemory sizes Redis for dedup: it writes b.N DONE records through a
// handler of the default prefix ("dedup") with a 9-byte name, then reports what
// MEMORY USAGE says of a sample of them (bytes/record) and, on a redis-server of its
// own, how much used_memory grew per record (used-bytes/record, which adds the
// keyspace's and the expiry table's share). Records: a UUID key; the same with a
// payload fingerprint; a key too long to store as is (kept as its SHA-256); a UUID
// key with a stored reply (WithReplies) of 64 bytes, 1 KiB and 16 KiB.
//
//	go test -run '^$' -bench RecordMemory -benchtime 100000x ./dedup
//	DEDUP_REDIS_ADDR=127.0.0.1:6379 go test -run '^$' -bench 'RecordMemory/server:external' -benchtime 2000x ./dedup
func BenchmarkRecordMemory(b *testing.B) {
	servers := []string{"spawned"}
	if os.Getenv("DEDUP_REDIS_ADDR") != "" {
		servers = append(servers, "external")
	}
	kinds := []struct {
		name  string
		fp    bool
		key   func() string
		reply int // bytes of stored reply; 0: none
	}{
		{"uuid", false, uuid4, 0},
		{"uuid+fingerprint", true, uuid4, 0},
		{"hashed", false, func() string { return "order " + uuid4() + strings.Repeat(" line item", 8) }, 0},
		{"uuid+reply:64B", false, uuid4, 64},
		{"uuid+reply:1KiB", false, uuid4, 1 << 10},
		{"uuid+reply:16KiB", false, uuid4, 16 << 10},
	}
	for _, srv := range servers {
		for _, k := range kinds {
			b.Run(fmt.Sprintf("server:%s/record:%s", srv, k.name), func(b *testing.B) {
				var c *redis.Client
				if srv == "external" {
					c = redis.NewClient(&redis.Options{Addr: os.Getenv("DEDUP_REDIS_ADDR")})
				} else {
					c = redis.NewClient(&redis.Options{Addr: spawnRedis(b)})
				}
				name := "inv" + testenv.Prefix()[4:10] // unique, 9 bytes like "inventory"
				b.Cleanup(func() {
					testenv.DeletePrefix(b, c, DefaultPrefix+":"+name)
					c.Close()
				})
				recordMemory(b, c, name, k.fp, k.key, k.reply, srv == "spawned")
			})
		}
	}
}

func recordMemory(b *testing.B, c *redis.Client, name string, fp bool, key func() string, replySize int, ownServer bool) {
	ctx := context.Background()
	st, err := redisstore.New(c)
	if err != nil {
		b.Fatal(err)
	}
	d, err := New(st, WithLogger(quiet))
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	opts := []HandlerOption{WithFingerprint(fp), WithLocalCache(0, 0)}
	if replySize > 0 {
		opts = append(opts, WithReplies(replySize))
	}
	h, err := d.Register(name, opts...)
	if err != nil {
		b.Fatal(err)
	}
	reply := make([]byte, replySize)
	_, _ = rand.Read(reply)
	usedMemory := func() int64 {
		n, _ := strconv.ParseInt(infoField(c.Info(ctx, "memory").Val(), "used_memory"), 10, 64)
		return n
	}
	const chunk = 500
	var sample []string
	before := usedMemory()
	b.ResetTimer()
	for done := 0; done < b.N; {
		n := min(chunk, b.N-done)
		items := make([]Item, n)
		for i := range items {
			items[i] = Item{Key: key(), Payload: []byte(`{"order":42,"sku":"A-1","qty":1}`)}
		}
		var rs []ItemResult
		if replySize > 0 {
			rs = h.Run(ctx, items, replyingEach(func(context.Context, int) ([]byte, error) { return reply, nil }), Parallel(1))
		} else {
			rs = h.Run(ctx, items, func(context.Context, int) error { return nil })
		}
		for i, r := range rs {
			if r.Outcome != Processed {
				b.Fatalf("%v %v", r.Outcome, r.Err)
			}
			if len(sample) < 1000 {
				sample = append(sample, h.RecordKey(items[i].Key))
			}
		}
		done += n
	}
	b.StopTimer()
	if ownServer { // used_memory moves with other clients' keys on a shared server
		b.ReportMetric(float64(usedMemory()-before)/float64(b.N), "used-bytes/record")
	}
	var total int64
	for _, k := range sample {
		n, err := c.MemoryUsage(ctx, k).Result()
		if err != nil {
			b.Fatal(err)
		}
		total += n
	}
	b.ReportMetric(float64(total)/float64(len(sample)), "bytes/record")
	b.ReportMetric(float64(len(sample[0])), "key-bytes")
	v, _ := c.Get(ctx, sample[0]).Result()
	b.ReportMetric(float64(len(v)), "value-bytes")
}

// infoField returns a field of an INFO reply.
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return v
		}
	}
	return ""
}
