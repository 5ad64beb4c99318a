package dedup

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/memstore"
)

// lateClaimMany makes the reply to ClaimMany arrive after the lease as the batch
// reckons it (from when it sent the claims) has run out, while the records themselves
// are fresh: what a starved process sees when its reply sits unread. after, when set,
// runs on the records once they are claimed.
type lateClaimMany struct {
	driver.Store
	delay time.Duration
	after func(entries []driver.Entry)
}

func (s *lateClaimMany) Claim(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	time.Sleep(s.delay)
	a, err := s.Store.Claim(ctx, entries)
	if err == nil && s.after != nil {
		s.after(entries)
	}
	return a, err
}

// starvedBatch runs a batch of keys a, b, c through store with a 300ms lease, the
// claims' reply arriving 400ms late. It returns the results and the items fn ran.
func starvedBatch(t *testing.T, store driver.Store) (*Handler, []ItemResult, []int) {
	t.Helper()
	d, err := New(store, WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	h, err := d.Register("starved", WithLease(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var ran []int
	res := h.Run(context.Background(), []Item{{Key: "a"}, {Key: "b"}, {Key: "c"}}, func(ctx context.Context, i int) error {
		mu.Lock()
		ran = append(ran, i)
		mu.Unlock()
		return nil
	})
	return h, res, ran
}

// An item whose turn comes after the lease ran out as the process reckons it, but
// whose claim still holds its token, renews the claim and runs: nobody else can have
// claimed or completed the key. Before, every item of such a batch was LeaseLost and
// its claim left to expire, and each redelivery was InProgress meanwhile.
func TestBatchRenewsClaimsTheHeartbeatLostTrackOf(t *testing.T) {
	mem, _ := memstore.New()
	_, res, ran := starvedBatch(t, &lateClaimMany{Store: mem, delay: 400 * time.Millisecond})
	for i, r := range res {
		if r.Outcome != Processed || r.Err != nil {
			t.Errorf("item %d: %v, %v; want Processed", i, r.Outcome, r.Err)
		}
	}
	if len(ran) != 3 {
		t.Errorf("fn ran for items %v, want all 3", ran)
	}
}

// A renewal never takes a key another owner holds: the item is LeaseLost, fn does not
// run for it, and the other owner's claim is left alone.
func TestBatchRenewalRefusedForAnotherOwner(t *testing.T) {
	mem, _ := memstore.New()
	ctx := context.Background()
	store := &lateClaimMany{Store: mem, delay: 400 * time.Millisecond, after: func(e []driver.Entry) {
		// b's lease ended and a rival claimed it
		if err := release1(ctx, mem, e[1].Key, e[1].Token); err != nil {
			t.Error(err)
		}
		if a, err := claim1(ctx, mem, e[1].Key, "rival", "", time.Minute); err != nil || a.Status != driver.StatusAcquired {
			t.Errorf("rival's claim: %v, %v", a.Status, err)
		}
	}}
	h, res, ran := starvedBatch(t, store)
	if res[1].Outcome != LeaseLost || !errors.Is(res[1].Err, ErrLeaseLost) {
		t.Errorf("item b: %v, %v; want LeaseLost", res[1].Outcome, res[1].Err)
	}
	for _, i := range ran {
		if i == 1 {
			t.Error("fn ran for b, which another owner holds")
		}
	}
	if res[0].Outcome != Processed || res[2].Outcome != Processed {
		t.Errorf("items a, c: %v, %v; want Processed", res[0].Outcome, res[2].Outcome)
	}
	if a, _ := claim1(ctx, mem, h.RecordKey("b"), "third", "", time.Minute); a.Status != driver.StatusInProgress {
		t.Errorf("b after the batch: %v, want still the rival's (InProgress)", a.Status)
	}
}

// When the renewal itself fails (the store errs), the item is LeaseLost and its claim,
// still ours, is given back at once rather than left for a rival to wait out.
func TestBatchReleasesAClaimItCouldNotRenew(t *testing.T) {
	mem, _ := memstore.New()
	hs := &hookStore{Store: mem}
	hs.onFail(func(op string) error {
		if op == "extend" {
			return ErrStoreUnavailable
		}
		return nil
	})
	h, res, ran := starvedBatch(t, &lateClaimMany{Store: hs, delay: 400 * time.Millisecond})
	// the first renewal's failure stops the rest: each would wait as long, in turn
	if n := hs.extends.Load(); n != 1 {
		t.Errorf("%d extends for 3 items, want 1: renewals go on after the store failed", n)
	}
	if len(ran) != 0 {
		t.Errorf("fn ran for %v with no lease", ran)
	}
	h.d.Close() // the releases go in the background; Close waits for them
	for i, r := range res {
		if r.Outcome != LeaseLost {
			t.Errorf("item %d: %v, want LeaseLost", i, r.Outcome)
		}
		a, _ := claim1(context.Background(), mem, h.RecordKey(string(rune('a'+i))), "rival", "", time.Minute)
		if a.Status != driver.StatusAcquired {
			t.Errorf("item %d: a rival's claim got %v (ttl %v), want the claim released", i, a.Status, a.TTL)
		}
	}
}

// Once Close has begun, a batch renews nothing: its remaining items are Cancelled and
// their claims given back, without a round trip each.
func TestBatchDoesNotRenewWhileClosing(t *testing.T) {
	mem, _ := memstore.New()
	hs := &hookStore{Store: mem}
	var d *Deduper
	closed := make(chan struct{})
	store := &lateClaimMany{Store: hs, delay: 400 * time.Millisecond, after: func([]driver.Entry) {
		go func() { d.Close(); close(closed) }() // waits for this batch and its releases
		for d.ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
	}}
	d, _ = New(store, WithLogger(quiet))
	h, _ := d.Register("closing", WithLease(300*time.Millisecond))
	ran := 0
	res := h.Run(context.Background(), []Item{{Key: "a"}, {Key: "b"}}, func(context.Context, int) error {
		ran++
		return nil
	})
	if ran != 0 {
		t.Errorf("fn ran %d times after Close began", ran)
	}
	for i, r := range res {
		if r.Outcome != Cancelled || !errors.Is(r.Err, ErrClosed) {
			t.Errorf("item %d: %v, %v; want Cancelled, ErrClosed", i, r.Outcome, r.Err)
		}
	}
	if n := hs.extends.Load(); n != 0 {
		t.Errorf("%d extends while closing, want none", n)
	}
	<-closed
	for _, k := range []string{"a", "b"} {
		if a, _ := claim1(context.Background(), mem, h.RecordKey(k), "rival", "", time.Minute); a.Status != driver.StatusAcquired {
			t.Errorf("%s after the batch: %v, want its claim released", k, a.Status)
		}
	}
}
