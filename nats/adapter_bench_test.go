package nats

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/dedupkit/dedupkit/dedup"
)

// BenchmarkHandle measures the adapter's own cost per JetStream delivery (key, view,
// progress timer, outcome, ack) over the memory store, with fake deliveries whose
// acks are recorded in memory. answer=first runs fn for a new key each time;
// answer=duplicate answers a key the local tier holds.
//
//	go test -run '^$' -bench BenchmarkHandle -benchmem ./nats
func BenchmarkHandle(b *testing.B) {
	for _, mode := range []struct {
		name string
		m    dedup.Mode
	}{{"do", dedup.ModeDo}, {"filter", dedup.ModeFilter}} {
		for _, answer := range []string{"first", "duplicate"} {
			b.Run(fmt.Sprintf("mode=%s/answer=%s", mode.name, answer), func(b *testing.B) {
				store, err := dedup.NewMemoryStore(dedup.WithMemoryLimit(1 << 24))
				if err != nil {
					b.Fatal(err)
				}
				d, err := dedup.New(store)
				if err != nil {
					b.Fatal(err)
				}
				defer d.Close()
				h, err := d.Register("orders", dedup.WithMode(mode.m))
				if err != nil {
					b.Fatal(err)
				}
				cfg, err := newConfig(h, nil)
				if err != nil {
					b.Fatal(err)
				}
				j := &JetStream{adapter{h: h, cfg: cfg}}
				ctx := context.Background()
				fn := func(context.Context, *Msg) error { return nil }
				j.Handle(ctx, newFake("dup", "payload", 1), fn)
				var seq atomic.Int64
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						id := "dup"
						if answer == "first" {
							id = fmt.Sprint("id-", seq.Add(1))
						}
						if _, act := j.Handle(ctx, newFake(id, "payload", 1), fn); act != ActAck {
							b.Errorf("action %v, want ack", act)
							return
						}
					}
				})
			})
		}
	}
}
