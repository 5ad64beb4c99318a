package dedup

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// countedRedis returns Redis stores whose client counts what it sends: miniredis,
// and the real server as a second case.
func countedRedis(t *testing.T) map[string]func(t *testing.T) (*redisstore.Store, *testenv.TripCounter, string) {
	out := map[string]func(t *testing.T) (*redisstore.Store, *testenv.TripCounter, string){}
	for name, mk := range testenv.CountedRedis() {
		out[name] = func(t *testing.T) (*redisstore.Store, *testenv.TripCounter, string) {
			c, tc, prefix := mk(t)
			s, err := redisstore.New(c)
			if err != nil {
				t.Fatal(err)
			}
			return s, tc, prefix
		}
	}
	return out
}

// In filter mode a Mark through the engine is one command, one round trip, for a new
// key; a duplicate's SET NX PX finds the record, and a SET NX PX GET reads it.
func TestAMarkOfANewKeyIsOneCommand(t *testing.T) {
	for name, mk := range countedRedis(t) {
		t.Run(name, func(t *testing.T) {
			s, tc, prefix := mk(t)
			ctx := context.Background()
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
			testenv.ExpectTrips(t, "Mark of a new key", tc, 1, 1)
			tc.Reset()
			if res, err := h.Mark(ctx, "k"); res.Outcome != Duplicate {
				t.Fatal(res, err)
			}
			testenv.ExpectTrips(t, "Mark of a duplicate", tc, 2, 2)
		})
	}
}

// A Redis that is down is ErrStoreUnavailable, for single and batch calls.
func TestRedisDownIsStoreUnavailable(t *testing.T) {
	addr := testenv.RefusedAddr(t) // nothing listens there, and nothing can start to
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	s, _ := redisstore.New(c)
	ctx := context.Background()
	if _, err := claim1(ctx, s, "p:h:k", "T", "", time.Minute); !isUnavailable(err) {
		t.Fatalf("claim: %v", err)
	}
	if _, err := mark1(ctx, s, "p:h:k", "T", "", time.Minute); !isUnavailable(err) {
		t.Fatalf("mark: %v", err)
	}
	if err := extend1(ctx, s, "p:h:k", "T", time.Minute); !isUnavailable(err) {
		t.Fatalf("extend: %v", err)
	}
	if _, err := s.Claim(ctx, []driver.Entry{{Key: "p:h:k", Token: "T", TTL: time.Minute}}); !isUnavailable(err) {
		t.Fatalf("claim many: %v", err)
	}
	if _, err := s.Mark(ctx, []driver.Entry{{Key: "p:h:k", Token: "T", TTL: time.Minute}}); !isUnavailable(err) {
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
