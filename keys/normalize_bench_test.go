package keys

import (
	"strconv"
	"strings"
	"testing"
)

// benchKeys are precomputed raw keys, one per benchmark case.
var benchKeys = []struct {
	form string
	raw  string
}{
	{"plain", "orders:7f3a9c1e-5b2d-4e8f-a1c3-0d9e8b7a6f54"},
	{"plain", strings.Repeat("a", MaxPlainLen)},
	{"hashed", ""},
	{"hashed", strings.Repeat("a", MaxPlainLen+1)},
	{"hashed", "order id with spaces"},
	{"hashed", strings.Repeat("\x00\xff", 2048)},
}

var sink string

func BenchmarkNormalize(b *testing.B) {
	for _, bk := range benchKeys {
		b.Run("form:"+bk.form+";len:"+strconv.Itoa(len(bk.raw)), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bk.raw)))
			for b.Loop() {
				sink = Normalize(bk.raw)
			}
		})
	}
}

func BenchmarkRecordKey(b *testing.B) {
	for _, bk := range benchKeys {
		b.Run("form:"+bk.form+";len:"+strconv.Itoa(len(bk.raw)), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				sink = RecordKey("dedup", "orders.v1", bk.raw)
			}
		})
	}
}

func BenchmarkStrategy(b *testing.B) {
	var m Message = Raw{
		Headers: map[string]string{"Nats-Msg-Id": "7f3a9c1e", "Nats-Stream": "ORDERS", "Nats-Sequence": "123456"},
		Body:    []byte(strings.Repeat("x", 1024)),
	}
	cases := []struct {
		name string
		s    Strategy
	}{
		{"strategy:header", Header("Nats-Msg-Id")},
		{"strategy:composite;parts:2", Composite(Header("Nats-Stream"), Header("Nats-Sequence"))},
		{"strategy:payload;len:1024", Payload()},
		{"strategy:firstof;miss:1", FirstOf(Header("Idempotency-Key"), Header("Nats-Msg-Id"))},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				sink = c.s.Key(m)
			}
		})
	}
}
