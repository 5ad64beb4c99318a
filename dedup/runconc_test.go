package dedup

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// TestRunConcRunsExactlyConc: the Redis benchmarks' conc=N means N goroutines at
// once, never more (b.RunParallel's conc=1 ran GOMAXPROCS of them), and every one of
// the n calls is made.
func TestRunConcRunsExactlyConc(t *testing.T) {
	for _, conc := range []int{1, 3, 16} {
		var arrived, calls atomic.Int64
		release := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- runConc(500, conc, func() error {
				calls.Add(1)
				if arrived.Add(1) <= int64(conc) {
					<-release // the first conc calls hold their goroutines
				}
				return nil
			})
		}()
		deadline := time.Now().Add(5 * time.Second)
		for arrived.Load() < int64(conc) {
			if time.Now().After(deadline) {
				t.Fatalf("conc %d: only %d goroutines ran at once", conc, arrived.Load())
			}
			time.Sleep(time.Millisecond)
		}
		// with conc goroutines held, no other call can start: one more goroutine would
		time.Sleep(50 * time.Millisecond)
		if n := arrived.Load(); n != int64(conc) {
			t.Errorf("conc %d: %d calls started while %d were held, want no more goroutines", conc, n, conc)
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if calls.Load() != 500 {
			t.Errorf("conc %d: %d calls, want 500", conc, calls.Load())
		}
	}
}

// TestRunConcStopsOnError: the first error is returned and the goroutines stop.
func TestRunConcStopsOnError(t *testing.T) {
	boom := errors.New("boom")
	var calls atomic.Int64
	err := runConc(1_000_000, 4, func() error {
		if calls.Add(1) == 10 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err %v, want boom", err)
	}
	if n := calls.Load(); n > 1000 {
		t.Errorf("%d calls after the error, want the goroutines to stop", n)
	}
}
