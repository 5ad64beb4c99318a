package sqltx_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/internal/testenv"
	"github.com/dedupkit/dedupkit/sqltx"
)

// A COMMIT SQLite answers with SQLITE_BUSY leaves the transaction open on its
// connection. Commit must report a known failure, and the transaction must be over
// when the connection returns to the pool, or the next Begin on it would fail
// ("cannot start a transaction within a transaction"). modernc.org/sqlite rolls it
// back in its Commit; this test pins that the contract holds with it.
func TestSQLiteBusyCommitRollsBack(t *testing.T) {
	// A rollback journal (not WAL): a reader's SHARED lock keeps a writer from
	// committing. A short busy timeout makes the COMMIT give up quickly.
	dsn := "file:" + filepath.Join(t.TempDir(), "busy.db") + "?_pragma=busy_timeout(200)&_pragma=journal_mode(DELETE)"
	db := testenv.OpenSQL(t, "sqlite", dsn)
	db.SetMaxOpenConns(2)
	ctx := context.Background()
	tr, err := sqltx.New(db, sqltx.SQLite)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if err := tr.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	m := dedup.Marker{Handler: "h", Digest: dedup.RecordDigest("k"), Owner: "run-1", Retention: time.Hour}
	tx, _, err := tr.Begin(ctx, []dedup.Marker{m})
	if err != nil {
		t.Fatal(err)
	}

	reader, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Rollback()
	var n int
	if err := reader.QueryRowContext(ctx, "SELECT count(*) FROM "+sqltx.DefaultTable).Scan(&n); err != nil {
		t.Fatal(err)
	}

	err = tr.Commit(ctx, tx)
	if err == nil {
		t.Fatal("Commit succeeded under a reader's SHARED lock")
	}
	if errors.Is(err, dedup.ErrCommitUnknown) {
		t.Fatalf("a BUSY COMMIT: %v, want a known failure", err)
	}
	// The reader holds one connection: this Begin gets the refused commit's.
	m.Owner = "run-2"
	tx, found, err := tr.Begin(ctx, []dedup.Marker{m})
	if err != nil {
		t.Fatalf("Begin on the connection of the refused commit: %v", err)
	}
	if found[0].Found {
		t.Fatal("the refused commit's marker was found")
	}
	if err := tr.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}
}
