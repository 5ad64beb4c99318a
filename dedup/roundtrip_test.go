package dedup

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/internal/testenv"
)

// countedRedis returns a Redis store whose client counts what it sends: miniredis, and
// the real server as a second case.
func countedRedis(t *testing.T) map[string]func(t *testing.T) (*RedisStore, *testenv.TripCounter, string) {
	mk := func(c *redis.Client, prefix string) (*RedisStore, *testenv.TripCounter, string) {
		tc := &testenv.TripCounter{}
		c.AddHook(tc)
		s, err := NewRedisStore(c)
		if err != nil {
			t.Fatal(err)
		}
		return s, tc, prefix
	}
	return map[string]func(t *testing.T) (*RedisStore, *testenv.TripCounter, string){
		"miniredis": func(t *testing.T) (*RedisStore, *testenv.TripCounter, string) {
			_, c := newMiniredis(t)
			return mk(c, testenv.Prefix())
		},
		"redis-server": func(t *testing.T) (*RedisStore, *testenv.TripCounter, string) {
			p := testenv.Prefix()
			return mk(realRedis(t, p), p)
		},
	}
}

func TestBatchIsOneRoundTrip(t *testing.T) {
	for name, mk := range countedRedis(t) {
		t.Run(name, func(t *testing.T) {
			s, tc, prefix := mk(t)
			ctx := context.Background()
			const n = 100
			entries := make([]Entry, n)
			for i := range entries {
				entries[i] = Entry{Key: fmt.Sprintf("%s:h:%d", prefix, i), Token: "T", TTL: time.Minute}
			}
			// warm the script cache so the count is the steady state
			for range 2 { // the second finds the first's claim: the claim_many script
				if _, err := s.ClaimMany(ctx, []Entry{{Key: prefix + ":h:warm", Token: "T", TTL: time.Minute}}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.CompleteMany(ctx, []Entry{{Key: prefix + ":h:warm", Token: "T", TTL: time.Minute}}); err != nil {
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
			expectTrips(t, "ClaimMany", tc, 2, n+1)
			for i, a := range claims {
				wantSt := StatusAcquired
				if i%10 == 0 {
					wantSt = StatusDuplicate
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
			expectTrips(t, "CompleteMany", tc, 1, 1) // one complete_many script call
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
			expectTrips(t, "MarkMany", tc, 1, n)
			for i, a := range marks {
				if a.Err != nil || a.Status != StatusAcquired {
					t.Fatalf("mark %d: %v %v", i, a.Status, a.Err)
				}
			}
			// filter mode through the engine: one command per Mark
			d, err := New(s, WithPrefix(prefix), WithLogger(quiet))
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			h, err := d.Register("f", WithMode(ModeFilter), WithLocalCache(0, 0))
			if err != nil {
				t.Fatal(err)
			}
			tc.Reset()
			if res, err := h.Mark(ctx, "k"); res.Outcome != First {
				t.Fatal(res, err)
			}
			if res, err := h.Mark(ctx, "k"); res.Outcome != Duplicate {
				t.Fatal(res, err)
			}
			expectTrips(t, "2 × Mark", tc, 2, 2)
		})
	}
}

func expectTrips(t *testing.T, what string, tc *testenv.TripCounter, trips, cmds int64) {
	t.Helper()
	if tc.Trips() != trips || tc.Cmds() != cmds {
		t.Fatalf("%s: %d round trips carrying %d commands, want %d carrying %d", what, tc.Trips(), tc.Cmds(), trips, cmds)
	}
}

// After the server loses its script cache (a restart, SCRIPT FLUSH), a batch still
// succeeds: the NOSCRIPT entries go again as EVAL.
func TestBatchSurvivesScriptFlush(t *testing.T) {
	_, c := newMiniredis(t)
	s, _ := NewRedisStore(c)
	ctx := context.Background()
	if _, err := s.Claim(ctx, "p:h:warm", "T", "", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	got, err := s.ClaimMany(ctx, []Entry{{Key: "p:h:a", Token: "T", TTL: time.Minute}, {Key: "p:h:b", Token: "T", TTL: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range got {
		if a.Err != nil || a.Status != StatusAcquired {
			t.Fatalf("%v %v", a.Status, a.Err)
		}
	}
}

// A Redis that is down is ErrStoreUnavailable, for single and batch calls.
func TestRedisDownIsStoreUnavailable(t *testing.T) {
	addr := testenv.RefusedAddr(t) // nothing listens there, and nothing can start to
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	s, _ := NewRedisStore(c)
	ctx := context.Background()
	if _, err := s.Claim(ctx, "p:h:k", "T", "", time.Minute); !isUnavailable(err) {
		t.Fatalf("claim: %v", err)
	}
	if _, err := s.Mark(ctx, "p:h:k", "T", "", time.Minute); !isUnavailable(err) {
		t.Fatalf("mark: %v", err)
	}
	if err := s.Extend(ctx, "p:h:k", "T", time.Minute); !isUnavailable(err) {
		t.Fatalf("extend: %v", err)
	}
	if _, err := s.ClaimMany(ctx, []Entry{{Key: "p:h:k", Token: "T", TTL: time.Minute}}); !isUnavailable(err) {
		t.Fatalf("claim many: %v", err)
	}
	if _, err := s.MarkMany(ctx, []Entry{{Key: "p:h:k", Token: "T", TTL: time.Minute}}); !isUnavailable(err) {
		t.Fatalf("mark many: %v", err)
	}
	// through the engine: fail closed, fn not run
	d, _ := New(s, WithLogger(quiet))
	defer d.Close()
	h, _ := d.Register("orders")
	res, err := h.Do(ctx, "k", func(context.Context) error { t.Fatal("fn ran"); return nil })
	if res.Outcome != StoreUnavailable || !isUnavailable(err) {
		t.Fatalf("Do: %v %v", res.Outcome, err)
	}
}

func isUnavailable(err error) bool { return err != nil && errors.Is(err, ErrStoreUnavailable) }
