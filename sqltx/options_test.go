package sqltx_test

import (
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/sqltx"
)

func TestNewRefusesInvalidOptions(t *testing.T) {
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for name, opt := range map[string]sqltx.Option{
		"read-only":        sqltx.WithTxOptions(&sql.TxOptions{ReadOnly: true}),
		"sweep period":     sqltx.WithSweep(-time.Second, 10),
		"sweep batch":      sqltx.WithSweep(time.Second, 0),
		"sweep batch high": sqltx.WithSweep(time.Second, 100_001),
		"logger":           sqltx.WithLogger(nil),
		"table":            sqltx.WithTable("x; DROP TABLE y"),
	} {
		if _, err := sqltx.New(db, sqltx.SQLite, opt); !errors.Is(err, dedup.ErrInvalidOption) {
			t.Errorf("%s: %v, want an error wrapping ErrInvalidOption", name, err)
		}
	}
	if _, err := sqltx.New(nil, sqltx.SQLite); !errors.Is(err, dedup.ErrInvalidOption) {
		t.Errorf("nil db: %v", err)
	}
	for _, d := range []sqltx.Dialect{0, 4} {
		if _, err := sqltx.New(db, d); !errors.Is(err, dedup.ErrInvalidOption) {
			t.Errorf("dialect %v: %v", d, err)
		}
	}
	tr, err := sqltx.New(db, sqltx.SQLite, sqltx.WithTxOptions(&sql.TxOptions{Isolation: sql.LevelSerializable}), sqltx.WithTxOptions(nil))
	if err != nil {
		t.Fatal(err)
	}
	tr.Close()
}
