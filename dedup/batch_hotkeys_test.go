package dedup

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/memstore"
)

// Batches (parallel and not), Do calls and batches on goroutines of their own race on
// 12 hot keys, with random fn failures and runtime.Goexit, fingerprints on and off,
// local tier on and off: no key runs twice at once, none succeeds twice, nothing
// hangs.
func TestBatchesAndCallsOnHotKeys(t *testing.T) {
	for _, fp := range []bool{false, true} {
		for _, lc := range []int{0, 1000} {
			t.Run(fmt.Sprint(fp, lc), func(t *testing.T) { hotKeys(t, fp, lc) })
		}
	}
}

func hotKeys(t *testing.T, fpOn bool, lc int) {
	mem, _ := memstore.New()
	d, _ := New(mem, WithLogger(quiet))
	defer d.Close()
	opts := []HandlerOption{WithLease(2 * time.Second), WithFingerprint(fpOn)}
	if lc == 0 {
		opts = append(opts, WithLocalCache(0, 0))
	}
	h, err := d.Register("s", opts...)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	running := map[string]int{}
	succ := map[string]int{}
	var bad atomic.Int64
	body := func(k string) error {
		mu.Lock()
		running[k]++
		if running[k] > 1 {
			bad.Add(1)
			t.Errorf("key %s runs twice at once", k)
		}
		mu.Unlock()
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
		fail := rand.IntN(4) == 0
		goexit := rand.IntN(15) == 0
		mu.Lock()
		running[k]--
		if goexit {
			mu.Unlock()
			runtime.Goexit()
		}
		if !fail {
			succ[k]++
		}
		mu.Unlock()
		if fail {
			return errors.New("x")
		}
		return nil
	}
	ctx := WaitForRunning(context.Background())
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range 300 {
				if w%4 == 1 {
					ch := make(chan struct{})
					go func() { defer close(ch); hotBatch(ctx, h, it, body) }()
					<-ch
					continue
				}
				n := 1 + rand.IntN(6)
				items := make([]Item, n)
				for i := range items {
					items[i] = Item{Key: fmt.Sprint("k", rand.IntN(12), "-", it/30), Payload: []byte("p")}
				}
				if w%3 == 0 {
					k := items[0].Key
					handleKey(h, ctx, k, []byte("p"), func(context.Context) error { return body(k) })
					continue
				}
				h.Run(ctx, items, func(_ context.Context, i int) error { return body(items[i].Key) }, Parallel(1+rand.IntN(4)))
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("hang")
	}
	for k, n := range succ {
		if n > 1 {
			t.Errorf("key %s succeeded %d times", k, n)
		}
	}
}

// hotBatch is one batch of hot keys, on the calling goroutine (which a Goexit ends).
func hotBatch(ctx context.Context, h *Handler, it int, body func(string) error) {
	n := 1 + rand.IntN(6)
	items := make([]Item, n)
	for i := range items {
		items[i] = Item{Key: fmt.Sprint("k", rand.IntN(12), "-", it/30), Payload: []byte("p")}
	}
	h.Run(ctx, items, func(_ context.Context, i int) error { return body(items[i].Key) }, Parallel(1+rand.IntN(4)))
}
