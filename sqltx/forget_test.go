package sqltx_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/internal/testenv"
	"github.com/dedupkit/dedupkit/sqltx"
)

// For a transactional handler, "run this message again" takes both halves: the
// marker (Transactor.Forget) and the store's record (Handler.Forget). With the
// record forgotten alone, the marker still answers Duplicate.
func TestForgetDeletesTheMarkerSoTheMessageRunsAgain(t *testing.T) {
	db := testenv.OpenSQL(t, "sqlite", sqliteDSN(t))
	tr, err := sqltx.New(db, sqltx.SQLite)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ctx := context.Background()
	if err := tr.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	mem, _ := memstore.New()
	d, _ := dedup.New(mem)
	defer d.Close()
	h, _ := d.Register("orders")
	runs := 0
	run := func() dedup.Outcome {
		res, err := dedup.DoTx(ctx, h, "o-1", tr, func(context.Context, *sql.Tx) error { runs++; return nil })
		if err != nil {
			t.Fatal(err)
		}
		return res.Outcome
	}
	done := func() { // a committed run's completion lands in the background
		testenv.Eventually(t, 5*time.Second, "the record DONE", func() bool {
			info, err := h.Lookup(ctx, "o-1")
			return err == nil && info.State == driver.RecordDone
		})
	}
	if o := run(); o != dedup.Processed {
		t.Fatal(o)
	}
	done()
	if _, err := h.Forget(ctx, "o-1"); err != nil {
		t.Fatal(err)
	}
	if o := run(); o != dedup.Duplicate || runs != 1 {
		t.Fatalf("with the record forgotten alone: %v, %d runs; want Duplicate (the marker), 1", o, runs)
	}
	done() // repaired by the duplicate
	if found, err := tr.Forget(ctx, h, "o-1"); err != nil || !found {
		t.Fatalf("Forget: %v %v", found, err)
	}
	if _, err := h.Forget(ctx, "o-1"); err != nil {
		t.Fatal(err)
	}
	if _, found, _ := tr.Lookup(ctx, h.Name(), dedup.RecordDigest(h.RecordKey("o-1"))); found {
		t.Fatal("the marker is still there")
	}
	if o := run(); o != dedup.Processed || runs != 2 {
		t.Fatalf("with both forgotten: %v, %d runs; want Processed, 2", o, runs)
	}
	if found, err := tr.Forget(ctx, h, "absent"); err != nil || found {
		t.Fatalf("Forget of an absent marker: %v %v", found, err)
	}
}
