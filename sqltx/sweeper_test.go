package sqltx_test

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/internal/testenv"
	"github.com/dedupkit/dedupkit/sqltx"
)

// A sweep that fails is logged, and the sweeper goes on; Close stops it.
func TestSweeperLogsFailure(t *testing.T) {
	db := testenv.OpenSQL(t, "sqlite", "file:"+filepath.Join(t.TempDir(), "m.db"))
	var buf testenv.LogBuffer
	tr, err := sqltx.New(db, sqltx.SQLite, sqltx.WithTable("never_migrated"),
		sqltx.WithSweep(10*time.Millisecond, 5), sqltx.WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "two failed sweeps logged", func() bool {
		return strings.Count(buf.String(), "sqltx: sweeping expired markers failed") >= 2
	})
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "no such table") {
		t.Fatalf("the log lacks the cause:\n%s", buf.String())
	}
}
