package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// countedRedis returns Redis stores whose client counts what it sends: miniredis,
// and the real server as a second case.
func countedRedis(t *testing.T) map[string]func(t *testing.T) (*Store, *testenv.TripCounter, string) {
	out := map[string]func(t *testing.T) (*Store, *testenv.TripCounter, string){}
	for name, mk := range testenv.CountedRedis() {
		out[name] = func(t *testing.T) (*Store, *testenv.TripCounter, string) {
			c, tc, prefix := mk(t)
			s, err := New(c)
			if err != nil {
				t.Fatal(err)
			}
			return s, tc, prefix
		}
	}
	return out
}

func TestBatchIsOneRoundTrip(t *testing.T) {
	for name, mk := range countedRedis(t) {
		t.Run(name, func(t *testing.T) {
			s, tc, prefix := mk(t)
			ctx := context.Background()
			const n = 100
			entries := make([]driver.Entry, n)
			for i := range entries {
				entries[i] = driver.Entry{Key: fmt.Sprintf("%s:h:%d", prefix, i), Token: "T", TTL: time.Minute}
			}
			// warm the script cache so the count is the steady state
			for range 2 { // the second finds the first's claim: the claim_many script
				if _, err := s.ClaimMany(ctx, []driver.Entry{{Key: prefix + ":h:warm", Token: "T", TTL: time.Minute}}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.CompleteMany(ctx, []driver.Entry{{Key: prefix + ":h:warm", Token: "T", TTL: time.Minute}}); err != nil {
				t.Fatal(err)
			}
			// some keys already taken, so the answers differ and order matters
			for i := 0; i < n; i += 10 {
				if _, err := s.Mark(ctx, entries[i].Key, "other", "", time.Minute); err != nil {
					t.Fatal(err)
				}
			}
			tc.Reset()
			claims, err := s.ClaimMany(ctx, entries)
			if err != nil {
				t.Fatal(err)
			}
			// a SET NX PX GET per key; the keys that found a record go again, to one
			// claim_many script call
			testenv.ExpectTrips(t, "ClaimMany", tc, 2, n+1)
			for i, a := range claims {
				wantSt := driver.StatusAcquired
				if i%10 == 0 {
					wantSt = driver.StatusDuplicate
				}
				if a.Err != nil || a.Status != wantSt {
					t.Fatalf("claim %d: %v %v, want %v", i, a.Status, a.Err, wantSt)
				}
			}
			tc.Reset()
			errs, err := s.CompleteMany(ctx, entries)
			if err != nil {
				t.Fatal(err)
			}
			testenv.ExpectTrips(t, "CompleteMany", tc, 1, 1) // one complete_many script call
			for i, e := range errs {
				if (i%10 == 0) != (e != nil) {
					t.Fatalf("complete %d: %v", i, e)
				}
			}
			for i := range entries {
				entries[i].Key += ":m"
			}
			tc.Reset()
			marks, err := s.MarkMany(ctx, entries)
			if err != nil {
				t.Fatal(err)
			}
			testenv.ExpectTrips(t, "MarkMany", tc, 1, n)
			for i, a := range marks {
				if a.Err != nil || a.Status != driver.StatusAcquired {
					t.Fatalf("mark %d: %v %v", i, a.Status, a.Err)
				}
			}
		})
	}
}

// After the server loses its script cache (a restart, SCRIPT FLUSH), a batch still
// succeeds: the NOSCRIPT entries go again as EVAL.
func TestBatchSurvivesScriptFlush(t *testing.T) {
	_, c := testenv.Miniredis(t)
	s, _ := New(c)
	ctx := context.Background()
	if _, err := s.Claim(ctx, "p:h:warm", "T", "", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	got, err := s.ClaimMany(ctx, []driver.Entry{{Key: "p:h:a", Token: "T", TTL: time.Minute}, {Key: "p:h:b", Token: "T", TTL: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range got {
		if a.Err != nil || a.Status != driver.StatusAcquired {
			t.Fatalf("%v %v", a.Status, a.Err)
		}
	}
}
