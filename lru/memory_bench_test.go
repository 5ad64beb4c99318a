package lru

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"runtime"
	"testing"
	"time"
)

// BenchmarkMemoryPerEntry sizes the local tier: each iteration builds a cache of size
// n, adds 2n distinct keys so that every shard is full (a busy handler's steady
// state), and reports the live heap it then holds per key held (runtime.MemStats
// HeapAlloc after a GC, from before New; the keys' own strings are excluded, the
// cache keeps copies). Keys are what dedup puts in it: a 36-byte UUID key (kept inside
// its node), and the same with a payload fingerprint ("<key>#<32 hex>", 69 bytes,
// kept in a separate string).
//
//	go test -run '^$' -bench MemoryPerEntry -benchtime 3x ./lru
func BenchmarkMemoryPerEntry(b *testing.B) {
	for _, n := range []int{10_000, 1_000_000} {
		for _, fp := range []bool{false, true} {
			keys := make([]string, 2*n)
			for i := range keys {
				var u [16]byte
				_, _ = rand.Read(u[:])
				h := hex.EncodeToString(u[:])
				keys[i] = h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
				if fp {
					keys[i] += "#" + h
				}
			}
			b.Run(fmt.Sprintf("entries:%d/key:%dB", n, len(keys[0])), func(b *testing.B) {
				var total float64
				for range b.N {
					total += heapPerEntry(b, n, keys)
				}
				b.ReportMetric(total/float64(b.N), "bytes/entry")
			})
		}
	}
}

func heapPerEntry(b *testing.B, size int, keys []string) float64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c, err := New(size, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	for _, k := range keys {
		c.Add(k)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := c.Len()
	if held != c.Cap() {
		b.Fatalf("the cache holds %d keys, not its %d", held, c.Cap())
	}
	runtime.KeepAlive(c)
	c.Close()
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(held)
}

// BenchmarkBytesMemory checks BytesEntryOverhead: it fills a Bytes with n entries
// of a 36-byte key and a value of each size, and reports the live heap it holds
// per entry beyond the key and value bytes (which the budget counts at their
// length; their allocations round up to a size class).
//
//	go test -run '^$' -bench BytesMemory -benchtime 3x ./lru
func BenchmarkBytesMemory(b *testing.B) {
	const n = 100_000
	for _, size := range []int{16, 1024} {
		b.Run(fmt.Sprintf("entries:%d/value:%dB", n, size), func(b *testing.B) {
			var total float64
			for range b.N {
				keys := make([]string, n)
				values := make([]string, n)
				for i := range keys {
					var u [16]byte
					_, _ = rand.Read(u[:])
					h := hex.EncodeToString(u[:])
					keys[i] = h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
					values[i] = string(make([]byte, size)) // as dedup passes them: its own string
				}
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				c, err := NewBytes(1<<40, time.Hour)
				if err != nil {
					b.Fatal(err)
				}
				for i := range keys {
					c.Add(keys[i], values[i])
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				if c.Len() != n {
					b.Fatalf("%d entries held", c.Len())
				}
				// the values were allocated before: what the map adds is its entries,
				// its table and its own copies of the keys
				total += (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / n
				runtime.KeepAlive(keys)
				runtime.KeepAlive(values)
				c.Close()
			}
			b.ReportMetric(total/float64(b.N), "overhead-bytes/entry")
		})
	}
}
