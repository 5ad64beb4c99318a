package pgxtx_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/pgxtx"
)

// A transactional run on PostgreSQL through pgx, as DoTx drives it: the marker and
// the handler's effect commit together, and a second run of the message finds the
// marker. (It needs a server, so it is compiled, not run, by go test.)
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DEDUP_POSTGRES_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	tr, err := pgxtx.New(pool, pgxtx.WithSweep(time.Minute, 1000))
	if err != nil {
		panic(err)
	}
	defer tr.Close() // stops the sweeper
	if err := tr.Migrate(ctx); err != nil {
		panic(err)
	}

	m := dedup.Marker{Handler: "payments", Digest: dedup.RecordDigest("dedup:payments:order-17"),
		Owner: "run-1", Retention: 24 * time.Hour}
	tx, found, err := tr.Begin(ctx, []dedup.Marker{m})
	if err != nil {
		panic(err)
	}
	if found[0].Found {
		_ = tr.Rollback(ctx, tx)
		fmt.Println("already processed")
		return
	}
	if _, err := tx.Exec(ctx, "INSERT INTO payments (id, cents) VALUES ($1, $2)", "order-17", 1250); err != nil {
		_ = tr.Rollback(ctx, tx)
		panic(err)
	}
	if err := tr.Commit(ctx, tx); err != nil {
		// errors.Is(err, dedup.ErrCommitUnknown): keep the claim; the redelivery's
		// Begin finds the marker if the commit happened.
		panic(err)
	}
	fmt.Println("processed")
}
