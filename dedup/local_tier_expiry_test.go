package dedup

import (
	"context"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
)

// Found by TestEveryStoreAgreesWithTheReferenceModel: a Mark that finds a DONE record written by another
// instance cached the key locally for the handler's whole retention, although the
// record had less left. Once the record expired and another owner claimed the key
// again, the local tier answered Duplicate for a record IN PROGRESS: had that owner
// failed, the message would have been dropped here and lost. The local tier runs on
// the real clock and the store on a fake one, so the record can expire under a
// local entry without a sleep.
func TestMarkDuplicateNotCachedBeyondRecord(t *testing.T) {
	f := newFixture(t, false)
	const retention = time.Hour
	h := f.handler("filter", WithRetention(retention))
	other := newDeduperOver(t, f.store).mustRegister(t, "filter", WithRetention(retention))
	ctx := context.Background()
	if res, _ := other.Mark(ctx, "k"); res.Outcome != First {
		t.Fatal(res)
	}
	f.clk.Add(retention - time.Minute) // the record has a minute left
	if res, _ := h.Mark(ctx, "k"); res.Outcome != Duplicate {
		t.Fatal(res)
	}
	f.clk.Add(2 * time.Minute) // the record is gone; a rival claims the key
	if a, err := claim1(ctx, f.mem, h.RecordKey("k"), "rival", "", time.Minute); err != nil || a.Status != driver.StatusAcquired {
		t.Fatal(a, err)
	}
	ran := false
	res, _ := h.Do(ctx, "k", func(context.Context) error { ran = true; return nil })
	if res.Outcome != InProgress || ran {
		t.Fatalf("Do answered %v/%v (ran %v) for a key IN PROGRESS elsewhere, want InProgress", res.Outcome, res.Tier, ran)
	}
}
