package sqltx_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/sqltx"
)

// A transactional run on SQLite, as DoTx drives it: Begin writes the marker in the
// transaction, the handler writes its effect in the same one, Commit makes both
// durable together. A second run of the same message finds the marker.
func Example() {
	dir, _ := os.MkdirTemp("", "sqltx-example")
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()
	tr, err := sqltx.New(db, sqltx.SQLite)
	if err != nil {
		panic(err)
	}
	defer tr.Close()
	if err := tr.Migrate(ctx); err != nil {
		panic(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE payments (id TEXT PRIMARY KEY, cents INTEGER)"); err != nil {
		panic(err)
	}

	run := func(owner string) {
		m := dedup.Marker{Handler: "payments", Digest: dedup.RecordDigest("dedup:payments:order-17"),
			Fingerprint: "f1", Owner: owner, Retention: 24 * time.Hour}
		tx, found, err := tr.Begin(ctx, []dedup.Marker{m})
		if err != nil {
			panic(err)
		}
		if found[0].Found {
			fmt.Println(owner+": already processed, fingerprint", found[0].Fingerprint)
			_ = tr.Rollback(ctx, tx)
			return
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO payments VALUES ('order-17', 1250)"); err != nil {
			_ = tr.Rollback(ctx, tx)
			panic(err)
		}
		if err := tr.Commit(ctx, tx); err != nil {
			panic(err)
		}
		fmt.Println(owner + ": processed")
	}
	run("run-1")
	run("run-2")

	info, ok, _ := tr.Lookup(ctx, "payments", dedup.RecordDigest("dedup:payments:order-17"))
	fmt.Println("marker:", ok, info.Owner, info.ExpiresIn > 23*time.Hour)
	// Output:
	// run-1: processed
	// run-2: already processed, fingerprint f1
	// marker: true run-1 true
}

// The schema Migrate creates, to put in a migration of your own instead.
func ExampleTransactor_Schema() {
	db, _ := sql.Open("sqlite", ":memory:")
	defer db.Close()
	tr, _ := sqltx.New(db, sqltx.PostgreSQL, sqltx.WithTable("app.dedup_markers"))
	defer tr.Close()
	fmt.Print(tr.Schema())
	// Output:
	// CREATE TABLE IF NOT EXISTS "app"."dedup_markers" (
	// 	handler     VARCHAR(64) NOT NULL,
	// 	key_hash    BYTEA       NOT NULL CHECK (octet_length(key_hash) = 32),
	// 	fingerprint VARCHAR(32) NOT NULL DEFAULT '',
	// 	owner       VARCHAR(64) NOT NULL,
	// 	expires_at  TIMESTAMPTZ NOT NULL,
	// 	PRIMARY KEY (handler, key_hash)
	// );
	// CREATE INDEX IF NOT EXISTS "dedup_markers_expires_idx" ON "app"."dedup_markers" (expires_at);
}
