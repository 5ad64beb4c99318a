package dedup

// WaitForRunning waits for a run's end and no longer, and a claim's round trips
// stay what they should.

import (
	"context"
	"sync"
	"testing"
	"time"
)

// WaitForRunning does not reach fn's context. Two runs whose fns each call Do for the
// key the other is running used to wait for each other until ctx ended (the NATS
// adapter's has no deadline: forever, holding two slots).
func TestFnDoesNotInheritWaitForRunning(t *testing.T) {
	fx := newFixture(t, true)
	h1, h2 := fx.handler("h1"), fx.handler("h2")
	ctx, cancel := context.WithTimeout(WaitForRunning(context.Background()), 10*time.Second)
	defer cancel()
	var both sync.WaitGroup
	both.Add(2)
	inner := make(chan Outcome, 2)
	var wg sync.WaitGroup
	cross := func(outer, other *Handler, key, otherKey string) {
		defer wg.Done()
		outer.Do(ctx, key, func(fctx context.Context) error {
			both.Done()
			both.Wait()
			res, _ := other.Do(fctx, otherKey, func(context.Context) error { return nil })
			inner <- res.Outcome
			return nil
		})
	}
	wg.Add(2)
	go cross(h1, h2, "a", "b")
	go cross(h2, h1, "b", "a")
	wg.Wait()
	// InProgress at once, or Duplicate when the other run has finished meanwhile;
	// Cancelled (ctx's deadline) means they waited for each other
	for range 2 {
		if o := <-inner; o != InProgress && o != Duplicate {
			t.Fatalf("an inner call answered %v, want InProgress or Duplicate", o)
		}
	}
}

// A waiter (WaitForRunning) gives up with InProgress once what is left of the running
// call's lease has passed, instead of holding its caller for the whole run.
func TestWaitForRunningGivesUpAfterTheLease(t *testing.T) {
	h := newFixture(t, true).handler("orders", WithLease(90*time.Millisecond))
	inside, release := make(chan struct{}), make(chan struct{})
	leader := make(chan struct{})
	go func() {
		defer close(leader)
		h.Do(context.Background(), "k", func(context.Context) error { close(inside); <-release; return nil })
	}()
	<-inside
	ctx, cancel := context.WithTimeout(WaitForRunning(context.Background()), 10*time.Second)
	defer cancel()
	res, err := h.Do(ctx, "k", ok) // the leader runs until we release it
	close(release)
	<-leader
	if err != nil || res.Outcome != InProgress || res.RetryAfter <= 0 {
		t.Fatalf("%v (retry after %v) %v, want InProgress with a delay", res.Outcome, res.RetryAfter, err)
	}
}
