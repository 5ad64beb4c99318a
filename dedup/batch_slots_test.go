package dedup

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/driver"
)

// Batch calls whose keys fall in many hash slots (on the cluster: on every master)
// answer each entry correctly and in entry order, on every store. The entries'
// states are interleaved, so an answer given to the wrong entry shows.
func TestBatchCallsOverManySlotsAnswerEachEntryInOrder(t *testing.T) {
	const n = 60
	for _, bf := range storeBackends() {
		t.Run(bf.name, func(t *testing.T) {
			t.Parallel()
			b := bf.new(t)
			ctx := context.Background()
			s := b.store
			key := func(set string, i int) string { return fmt.Sprintf("%s:h:%s-%d", b.prefix, set, i) }
			if cc, ok := b.rdb.(*redis.ClusterClient); ok {
				wantAllMasters(t, cc, n, func(i int) string { return key("claim", i) })
			}

			// ClaimMany over five states, interleaved by i%5.
			wantClaim := make([]driver.Status, n)
			entries := make([]driver.Entry, n)
			for i := range n {
				k := key("claim", i)
				fp := "fp"
				switch i % 5 {
				case 0: // absent
					wantClaim[i] = driver.StatusAcquired
				case 1: // IN PROGRESS, mine
					mustClaim(t, s, k, "A")
					wantClaim[i] = driver.StatusAcquired
				case 2: // IN PROGRESS, another owner's
					mustClaim(t, s, k, "X")
					wantClaim[i] = driver.StatusInProgress
				case 3: // DONE, same payload
					mustMark(t, s, k, "X", "fp")
					wantClaim[i] = driver.StatusDuplicate
				case 4: // DONE, another payload
					mustMark(t, s, k, "X", "other")
					wantClaim[i] = driver.StatusConflict
				}
				entries[i] = driver.Entry{Key: k, Token: "A", Fingerprint: fp, TTL: cLease}
			}
			got, err := s.Claim(ctx, entries)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != n {
				t.Fatalf("%d answers for %d entries", len(got), n)
			}
			for i, a := range got {
				if a.Err != nil || a.Status != wantClaim[i] {
					t.Fatalf("claim entry %d: %v %v, want %v", i, a.Status, a.Err, wantClaim[i])
				}
				if wantLeft := map[driver.Status]bool{driver.StatusInProgress: true, driver.StatusDuplicate: true}; wantLeft[a.Status] && (a.TTL <= 0 || a.TTL > cRetention) {
					t.Fatalf("claim entry %d: %v with %v left", i, a.Status, a.TTL)
				}
			}

			// CompleteMany with replies (owner-checked; one without writes DONE whoever
			// holds the key): the entries this token holds complete, the others' lease
			// is lost.
			done := make([]error, n)
			cs := make([]driver.Entry, n)
			for i := range n {
				cs[i] = driver.Entry{Key: key("claim", i), Token: "A", TTL: cRetention, Reply: "r", HasReply: true}
			}
			errs, err := s.Complete(ctx, cs)
			if err != nil {
				t.Fatal(err)
			}
			for i, e := range errs {
				switch i % 5 {
				case 0, 1:
					if e != nil {
						t.Fatalf("complete entry %d: %v", i, e)
					}
				default:
					if !errors.Is(e, ErrLeaseLost) {
						t.Fatalf("complete entry %d: %v, want ErrLeaseLost", i, e)
					}
				}
				done[i] = e
			}
			for i := range n { // the completed records are DONE now
				a, err := claim1(ctx, s, key("claim", i), "Z", "fp", cLease)
				if err != nil {
					t.Fatal(err)
				}
				if done[i] == nil && a.Status != driver.StatusDuplicate {
					t.Fatalf("entry %d completed but a claim answers %v", i, a.Status)
				}
			}

			// MarkMany over four states.
			wantMark := make([]driver.Status, n)
			marks := make([]driver.Entry, n)
			for i := range n {
				k := key("mark", i)
				switch i % 4 {
				case 0:
					wantMark[i] = driver.StatusAcquired
				case 1:
					mustClaim(t, s, k, "X")
					wantMark[i] = driver.StatusInProgress
				case 2:
					mustMark(t, s, k, "A", "fp") // mine, retried
					wantMark[i] = driver.StatusAcquired
				case 3:
					mustMark(t, s, k, "X", "fp")
					wantMark[i] = driver.StatusDuplicate
				}
				marks[i] = driver.Entry{Key: k, Token: "A", Fingerprint: "fp", TTL: cRetention}
			}
			got, err = s.Mark(ctx, marks)
			if err != nil {
				t.Fatal(err)
			}
			for i, a := range got {
				if a.Err != nil || a.Status != wantMark[i] {
					t.Fatalf("mark entry %d: %v %v, want %v", i, a.Status, a.Err, wantMark[i])
				}
			}
		})
	}
}

func mustClaim(t *testing.T, s driver.Store, k, token string) {
	t.Helper()
	if a, err := claim1(context.Background(), s, k, token, "fp", cLease); err != nil || a.Status != driver.StatusAcquired {
		t.Fatalf("claim %s: %v %v", k, a.Status, err)
	}
}

func mustMark(t *testing.T, s driver.Store, k, token, fp string) {
	t.Helper()
	if a, err := mark1(context.Background(), s, k, token, fp, cRetention); err != nil || a.Status != driver.StatusAcquired {
		t.Fatalf("mark %s: %v %v", k, a.Status, err)
	}
}

// wantAllMasters checks that the n keys are spread over every master of the cluster,
// so that the batch really spans slots and nodes.
func wantAllMasters(t *testing.T, cc *redis.ClusterClient, n int, key func(int) string) {
	t.Helper()
	ctx := context.Background()
	masters := map[string]bool{}
	for i := range n {
		m, err := cc.MasterForKey(ctx, key(i))
		if err != nil {
			t.Fatal(err)
		}
		masters[m.Options().Addr] = true
	}
	var all atomic.Int32 // ForEachMaster calls fn concurrently
	if err := cc.ForEachMaster(ctx, func(context.Context, *redis.Client) error { all.Add(1); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(masters) != int(all.Load()) || all.Load() < 2 {
		t.Fatalf("the batch's keys are on %d of %d masters", len(masters), all.Load())
	}
}
