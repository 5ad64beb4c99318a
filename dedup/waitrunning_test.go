package dedup

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A call for a key that a concurrent call in this process is running answers
// InProgress at once, unless its context asks to wait (WaitForRunning): then it gets
// the run's end, Duplicate when the run succeeded, or a run of its own when it failed.
func TestWaitForRunningGetsTheRunsEnd(t *testing.T) {
	for _, tc := range []struct {
		name      string
		leaderErr error
		wait      bool
		want      Outcome
		runs      int
	}{
		{"no-wait", nil, false, InProgress, 0},
		{"leader-succeeds", nil, true, Duplicate, 0},
		{"leader-fails", errors.New("boom"), true, Processed, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newFixture(t, true).handler("orders")
			inside, release := make(chan struct{}), make(chan struct{})
			leader := make(chan Outcome, 1)
			go func() {
				res, _ := h.Do(context.Background(), "k", func(context.Context) error {
					close(inside)
					<-release
					return tc.leaderErr
				})
				leader <- res.Outcome
			}()
			<-inside
			ctx := context.Background()
			if tc.wait {
				ctx = WaitForRunning(ctx)
			}
			runs := 0
			got := make(chan Result, 1)
			go func() {
				res, _ := h.Do(ctx, "k", func(context.Context) error { runs++; return nil })
				got <- res
			}()
			var res Result
			if tc.wait {
				select {
				case res := <-got:
					t.Fatalf("answered %v while the key was still running", res.Outcome)
				case <-time.After(50 * time.Millisecond):
				}
				close(release)
				res = <-got
			} else {
				res = <-got // answered while the leader still runs
				close(release)
			}
			<-leader
			if res.Outcome != tc.want || runs != tc.runs {
				t.Fatalf("%v with %d runs, want %v with %d", res.Outcome, runs, tc.want, tc.runs)
			}
		})
	}
}

// The wait ends with the caller's context.
func TestWaitForRunningEndsWithContext(t *testing.T) {
	h := newFixture(t, true).handler("orders")
	inside, release := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.Do(context.Background(), "k", func(context.Context) error { close(inside); <-release; return nil })
	}()
	<-inside
	ctx, cancel := context.WithTimeout(WaitForRunning(context.Background()), 30*time.Millisecond)
	defer cancel()
	res, err := h.Do(ctx, "k", ok)
	if res.Outcome != Cancelled || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v %v, want Cancelled by the deadline", res.Outcome, err)
	}
	close(release)
	<-done
}
