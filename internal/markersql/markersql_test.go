package markersql

import (
	"strings"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup"
)

func TestValidateTableRefusesUnsafeNames(t *testing.T) {
	for _, ok := range []string{"dedup_markers", "_x", "A1", "app.dedup_markers", strings.Repeat("a", 48)} {
		if err := ValidateTable(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "x; DROP TABLE y", `a"b`, "a`b", "a.b.c", "1a", "a-b", "a b", "é",
		strings.Repeat("a", 49), "a.", ".a", "a/*", "a\nb"} {
		if err := ValidateTable(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// Markers are written in (handler, digest) order whatever the caller's order, so
// that two Begins lock shared markers in one order.
func TestMarkersAreWrittenInHandlerDigestOrder(t *testing.T) {
	m := func(h string, d byte) dedup.Marker {
		return dedup.Marker{Handler: h, Digest: [32]byte{d}, Owner: "o", Retention: time.Second}
	}
	order, err := CheckMarkers([]dedup.Marker{m("b", 1), m("a", 2), m("a", 1)})
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{2, 1, 0}; order[0] != want[0] || order[1] != want[1] || order[2] != want[2] {
		t.Fatalf("order %v, want %v", order, want)
	}
	if _, err := CheckMarkers([]dedup.Marker{m("a", 1), m("b", 1), m("a", 1)}); err == nil ||
		!strings.Contains(err.Error(), "markers 0 and 2") {
		t.Fatalf("duplicate: %v", err)
	}
}

func TestRetentionRoundsUp(t *testing.T) {
	lite, _ := NewTable(SQLite, "t")
	pg, _ := NewTable(Postgres, "t")
	for _, c := range []struct {
		t    Table
		r    time.Duration
		want int64
	}{
		{lite, time.Nanosecond, 1}, {lite, time.Millisecond, 1}, {lite, 1500 * time.Microsecond, 2},
		{pg, time.Nanosecond, 1}, {pg, time.Second, 1_000_000},
	} {
		if got := c.t.Retention(c.r); got != c.want {
			t.Errorf("%v: %d, want %d", c.r, got, c.want)
		}
	}
}
