package pgxtx_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/internal/testenv"
	"github.com/dedupkit/dedupkit/pgxtx"
)

// Forget deletes the marker of a handler's message key, so that, with the store's
// record forgotten too, the message runs again.
func TestForgetDeletesTheMarkerSoTheMessageRunsAgain(t *testing.T) {
	pool, _ := openPool(t, false, false)
	table := testenv.TableName()
	tr, err := pgxtx.New(pool, pgxtx.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ctx := context.Background()
	if err := tr.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+table) })
	mem, _ := memstore.New()
	d, _ := dedup.New(mem)
	defer d.Close()
	h, _ := d.Register("orders")
	runs := 0
	run := func() dedup.Outcome {
		res, err := dedup.DoTx(ctx, h, "o-1", tr, func(context.Context, pgx.Tx) error { runs++; return nil })
		if err != nil {
			t.Fatal(err)
		}
		return res.Outcome
	}
	if o := run(); o != dedup.Processed {
		t.Fatal(o)
	}
	testenv.Eventually(t, 5*time.Second, "the record DONE", func() bool {
		info, err := h.Lookup(ctx, "o-1")
		return err == nil && info.State == driver.RecordDone
	})
	if found, err := tr.Forget(ctx, h, "o-1"); err != nil || !found {
		t.Fatalf("Forget: %v %v", found, err)
	}
	if _, err := h.Forget(ctx, "o-1"); err != nil {
		t.Fatal(err)
	}
	if o := run(); o != dedup.Processed || runs != 2 {
		t.Fatalf("with both forgotten: %v, %d runs; want Processed, 2", o, runs)
	}
	if found, err := tr.Forget(ctx, h, "absent"); err != nil || found {
		t.Fatalf("Forget of an absent marker: %v %v", found, err)
	}
}
