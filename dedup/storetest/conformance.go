// Package storetest checks a dedup store against driver.Store's table (docs/design.md
// §3): Run is a conformance suite, RunModel checks seeded random sequences against a
// reference model. A store proves itself with both, best on a fake clock:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) storetest.Backend {
//			clk := storetest.NewClock()
//			return storetest.Backend{Store: newStore(clk.Now), Prefix: "test", Advance: clk.Add, Now: clk.Now}
//		})
//	}
//
// On a real server pass Advance: time.Sleep and a Prefix unique to the test; the
// cases then sleep a few seconds each, in parallel.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/internal/storekit"
)

// Backend is one store under test.
type Backend struct {
	// Store is the store under test, empty of keys under Prefix.
	Store driver.Store
	// Prefix is the key prefix of the test (unique to it on a shared server).
	Prefix string
	// Advance moves the store's time forward: a Clock's Add, or time.Sleep.
	Advance func(time.Duration)
	// Now is the store's clock when Advance moves a fake one; nil means real time.
	Now func() time.Time
	// Raw reads and writes dedup's record encoding under the store; nil skips its cases.
	Raw Raw
}

// Raw reads and writes the server under a store directly.
type Raw interface {
	Get(ctx context.Context, key string) (string, error)
	Set(ctx context.Context, key, value string, ttl time.Duration) error
	PTTL(ctx context.Context, key string) (time.Duration, error)
}

// Short durations for a real server, which can only sleep; a wide margin for a
// loaded machine.
const (
	cLease     = time.Second
	cRetention = 3 * time.Second
	cMargin    = 400 * time.Millisecond
)

// maxReply is the largest reply a handler stores (the most WithReplies takes).
const maxReply = 1 << 20

// Run runs the conformance suite, each case in parallel on a Backend of its own:
// driver.Store's cases, replies and batches included, then RecordStore's if it has it.
func Run(t *testing.T, newBackend func(t *testing.T) Backend) {
	t.Helper()
	for _, c := range append(append(conformanceCases, replyCases...), foreignCase) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := checked(t, newBackend(t))
			c.run(t, &suite{t: t, b: b, ctx: context.Background()})
		})
	}
}

// checked fails t for a Backend the suites cannot use.
func checked(t *testing.T, b Backend) Backend {
	t.Helper()
	switch {
	case b.Store == nil || reflect.ValueOf(b.Store).Kind() == reflect.Pointer && reflect.ValueOf(b.Store).IsNil():
		t.Fatal("storetest: Backend.Store is nil")
	case b.Advance == nil:
		t.Fatal("storetest: Backend.Advance is nil (time.Sleep for a real server, a Clock's Add for a fake one)")
	case b.Prefix == "":
		t.Fatal("storetest: Backend.Prefix is empty (give each Backend a prefix of its own)")
	}
	return b
}

type suite struct {
	t   *testing.T
	b   Backend
	ctx context.Context
	n   int
	fps map[[2]string]string // the fingerprint of each key and token's claim: its completion's
}

func (s *suite) key() string {
	s.n++
	return s.b.Prefix + ":h:" + s.t.Name() + string(rune('a'+s.n))
}

// one is a batch of one entry.
func one(key, token, fp string, ttl time.Duration) []driver.Entry {
	return []driver.Entry{{Key: key, Token: token, Fingerprint: fp, TTL: ttl}}
}

// only is a call of one entry's answer and error (the entry's or the call's). A call
// that answers and fails at once breaks the contract's shape: an error that matches
// no class.
func only(as []driver.Answer, err error) (driver.Answer, error) {
	if err != nil && as != nil {
		return driver.Answer{}, fmt.Errorf("storetest: %d answers with the call's error %q", len(as), err)
	}
	return storekit.Only(as, err)
}

// onlyErr is only for a call that answers an error per entry.
func onlyErr(errs []error, err error) error {
	if err != nil && errs != nil {
		return fmt.Errorf("storetest: %d answers with the call's error %q", len(errs), err)
	}
	return storekit.OnlyErr(errs, err)
}

func (s *suite) claim(key, token, fp string) driver.Answer {
	s.t.Helper()
	a, err := only(s.b.Store.Claim(s.ctx, one(key, token, fp, cLease)))
	if err != nil {
		s.t.Fatalf("Claim: %v", err)
	}
	if s.fps == nil {
		s.fps = make(map[[2]string]string)
	}
	s.fps[[2]string{key, token}] = fp
	s.checkTTL(key)
	return a
}

func (s *suite) mark(key, token, fp string) driver.Answer {
	s.t.Helper()
	a, err := only(s.b.Store.Mark(s.ctx, one(key, token, fp, cRetention)))
	if err != nil {
		s.t.Fatalf("Mark: %v", err)
	}
	s.checkTTL(key)
	return a
}

// complete completes token's claim of key, with the claim's fingerprint as dedup
// does ("" for a key token did not claim).
func (s *suite) complete(key, token string) error {
	s.t.Helper()
	err := onlyErr(s.b.Store.Complete(s.ctx, one(key, token, s.fps[[2]string{key, token}], cRetention)))
	s.checkTTL(key)
	return err
}

// completeReply is complete with a reply to store with the DONE record.
func (s *suite) completeReply(key, token, reply string) error {
	s.t.Helper()
	err := onlyErr(s.b.Store.Complete(s.ctx, []driver.Entry{{Key: key, Token: token, TTL: cRetention, Reply: reply, HasReply: true}}))
	s.checkTTL(key)
	return err
}

func (s *suite) release(key, token string) error {
	s.t.Helper()
	return onlyErr(s.b.Store.Release(s.ctx, []driver.Entry{{Key: key, Token: token}}))
}

func (s *suite) extend(key, token string) error {
	s.t.Helper()
	return onlyErr(s.b.Store.Extend(s.ctx, one(key, token, "", cLease)))
}

func (s *suite) records() driver.RecordStore {
	s.t.Helper()
	rs, ok := s.b.Store.(driver.RecordStore)
	if !ok {
		s.t.Skipf("%T does not implement RecordStore", s.b.Store)
	}
	return rs
}

func (s *suite) lookup(keys ...string) []driver.Record {
	s.t.Helper()
	rs, err := s.records().Lookup(s.ctx, keys)
	if err != nil {
		s.t.Fatalf("Lookup: %v", err)
	}
	if len(rs) != len(keys) {
		s.t.Fatalf("Lookup: %d records for %d keys", len(rs), len(keys))
	}
	return rs
}

func (s *suite) forget(force bool, keys ...string) []driver.Record {
	s.t.Helper()
	rs, err := s.records().Forget(s.ctx, keys, force)
	if err != nil {
		s.t.Fatalf("Forget: %v", err)
	}
	if len(rs) != len(keys) {
		s.t.Fatalf("Forget: %d records for %d keys", len(rs), len(keys))
	}
	return rs
}

// wantRecord checks a record found: state, owner, fingerprint, and a TTL in (0, max].
func (s *suite) wantRecord(r driver.Record, state driver.RecordState, owner, fp string, max time.Duration) {
	s.t.Helper()
	if r.Err != nil && state != driver.RecordInProgress || r.State != state || r.Owner != owner || r.Fingerprint != fp ||
		r.TTL <= 0 || r.TTL > max || r.ReplySize != 0 {
		s.t.Fatalf("record %+v, want %v owned by %q, fingerprint %q, TTL in (0, %v], no reply", r, state, owner, fp, max)
	}
}

func (s *suite) wantStatus(a driver.Answer, want driver.Status) {
	s.t.Helper()
	if a.Status != want {
		s.t.Fatalf("status %v, want %v", a.Status, want)
	}
}

// checkTTL asserts the Redis-side rule that no record lives forever.
func (s *suite) checkTTL(key string) {
	s.t.Helper()
	if s.b.Raw == nil {
		return
	}
	ttl, err := s.b.Raw.PTTL(s.ctx, key)
	if err != nil {
		s.t.Fatal(err)
	}
	if ttl == -1 {
		s.t.Fatalf("record %s has no TTL", key)
	}
}

func (s *suite) must(err error) {
	s.t.Helper()
	if err != nil {
		s.t.Fatal(err)
	}
}

func (s *suite) wantLeaseLost(err error) {
	s.t.Helper()
	if !errors.Is(err, driver.ErrLeaseLost) {
		s.t.Fatalf("err %v, want driver.ErrLeaseLost", err)
	}
}

// conformanceCase is one case; it skips what the store lacks (RecordStore, Raw).
type conformanceCase struct {
	name string
	run  func(t *testing.T, s *suite)
}

var conformanceCases = []conformanceCase{
	{"claim/absent", func(t *testing.T, s *suite) {
		k := s.key()
		s.wantStatus(s.claim(k, "A", ""), driver.StatusAcquired)
	}},
	{"claim/in-progress-mine", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.b.Advance(cLease - cMargin)
		s.wantStatus(s.claim(k, "A", ""), driver.StatusAcquired)
		// the retried claim renewed the lease
		s.b.Advance(2 * cMargin)
		s.wantStatus(s.claim(k, "B", ""), driver.StatusInProgress)
	}},
	{"claim/in-progress-other", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		a := s.claim(k, "B", "")
		s.wantStatus(a, driver.StatusInProgress)
		if a.TTL <= 0 || a.TTL > cLease {
			t.Fatalf("remaining lease %v, want in (0, %v]", a.TTL, cLease)
		}
	}},
	{"claim/done", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "fp1")
		s.must(s.complete(k, "A"))
		a := s.claim(k, "B", "fp1")
		s.wantStatus(a, driver.StatusDuplicate)
		if a.TTL <= 0 || a.TTL > cRetention {
			t.Fatalf("DONE record's remaining life %v, want in (0, %v]", a.TTL, cRetention)
		}
		s.wantStatus(s.claim(k, "B", ""), driver.StatusDuplicate)
		s.wantStatus(s.claim(k, "A", "fp1"), driver.StatusDuplicate)
	}},
	{"claim/done-other-fingerprint", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "fp1")
		s.must(s.complete(k, "A"))
		s.wantStatus(s.claim(k, "B", "fp2"), driver.StatusConflict)
	}},
	{"claim/lease-expiry", func(t *testing.T, s *suite) {
		// A's lease runs out mid-run and B takes the key over; both runs succeed
		k := s.key()
		s.claim(k, "A", "")
		s.b.Advance(cLease + cMargin)
		s.wantStatus(s.claim(k, "B", ""), driver.StatusAcquired)
		s.must(s.complete(k, "A")) // fn succeeded: DONE, whoever holds the lease
		s.wantLeaseLost(s.extend(k, "B"))
		s.must(s.complete(k, "B"))
		s.wantStatus(s.claim(k, "C", ""), driver.StatusDuplicate)
	}},
	{"complete/rival-fails-after-done", func(t *testing.T, s *suite) {
		// B took the key over from A; A completes; B's run fails: its heartbeat finds
		// the lease lost, and its release leaves A's DONE, so a redelivery is a duplicate
		k := s.key()
		s.claim(k, "A", "fp1")
		s.b.Advance(cLease + cMargin)
		s.wantStatus(s.claim(k, "B", "fp1"), driver.StatusAcquired)
		s.must(s.complete(k, "A"))
		s.wantLeaseLost(s.extend(k, "B"))
		s.must(s.release(k, "B"))
		s.wantStatus(s.claim(k, "C", "fp1"), driver.StatusDuplicate)
		s.wantRecord(s.lookup(k)[0], driver.RecordDone, "A", "fp1", cRetention)
	}},
	{"complete/absent", func(t *testing.T, s *suite) {
		// the lease ran out and nobody claimed the key: DONE all the same
		k := s.key()
		s.must(s.complete(k, "A"))
		s.wantStatus(s.claim(k, "B", ""), driver.StatusDuplicate)
	}},
	{"complete/in-progress-mine", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.must(s.complete(k, "A"))
		// DONE lives for the retention, not the lease
		s.b.Advance(cRetention - cMargin)
		s.wantStatus(s.claim(k, "B", ""), driver.StatusDuplicate)
		s.b.Advance(2 * cMargin)
		s.wantStatus(s.claim(k, "B", ""), driver.StatusAcquired)
	}},
	{"complete/in-progress-other", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.must(s.complete(k, "B"))
		s.wantStatus(s.claim(k, "C", ""), driver.StatusDuplicate)
		s.wantLeaseLost(s.extend(k, "A"))
	}},
	{"complete/done-mine-retried", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.must(s.complete(k, "A"))
		s.must(s.complete(k, "A"))
	}},
	{"complete/done-other", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.must(s.complete(k, "A"))
		s.must(s.complete(k, "B"))
		s.wantStatus(s.claim(k, "C", ""), driver.StatusDuplicate)
	}},
	{"release/absent", func(t *testing.T, s *suite) {
		k := s.key()
		s.must(s.release(k, "A"))
		s.wantStatus(s.claim(k, "B", ""), driver.StatusAcquired)
	}},
	{"release/in-progress-mine", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.must(s.release(k, "A"))
		s.wantStatus(s.claim(k, "B", ""), driver.StatusAcquired)
	}},
	{"release/in-progress-other", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.must(s.release(k, "B"))
		s.wantStatus(s.claim(k, "C", ""), driver.StatusInProgress)
	}},
	{"release/done", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.must(s.complete(k, "A"))
		s.must(s.release(k, "A"))
		s.wantStatus(s.claim(k, "B", ""), driver.StatusDuplicate)
	}},
	{"extend/absent", func(t *testing.T, s *suite) {
		s.wantLeaseLost(s.extend(s.key(), "A"))
	}},
	{"extend/in-progress-mine", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.b.Advance(cLease - cMargin)
		s.must(s.extend(k, "A"))
		s.checkTTL(k)
		s.b.Advance(2 * cMargin) // past the first lease, inside the extended one
		s.wantStatus(s.claim(k, "B", ""), driver.StatusInProgress)
		s.must(s.complete(k, "A"))
	}},
	{"extend/in-progress-other", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.wantLeaseLost(s.extend(k, "B"))
	}},
	{"extend/done", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.must(s.complete(k, "A"))
		s.wantLeaseLost(s.extend(k, "A"))
	}},
	{"mark/absent", func(t *testing.T, s *suite) {
		k := s.key()
		s.wantStatus(s.mark(k, "A", ""), driver.StatusAcquired)
		s.wantStatus(s.claim(k, "B", ""), driver.StatusDuplicate) // the mark wrote DONE
		s.b.Advance(cRetention + cMargin)
		s.wantStatus(s.mark(k, "C", ""), driver.StatusAcquired)
	}},
	{"mark/in-progress-other", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.wantStatus(s.mark(k, "B", ""), driver.StatusInProgress)
		s.must(s.complete(k, "A")) // the mark did not disturb the claim
		s.wantStatus(s.mark(k, "B", ""), driver.StatusDuplicate)
	}},
	{"mark/done-mine-retried", func(t *testing.T, s *suite) {
		k := s.key()
		s.mark(k, "A", "")
		s.wantStatus(s.mark(k, "A", ""), driver.StatusAcquired)
	}},
	{"mark/done-other", func(t *testing.T, s *suite) {
		k := s.key()
		s.mark(k, "A", "fp1")
		s.wantStatus(s.mark(k, "B", "fp1"), driver.StatusDuplicate)
		s.wantStatus(s.mark(k, "B", "fp2"), driver.StatusConflict)
		s.wantStatus(s.mark(k, "B", ""), driver.StatusDuplicate)
	}},
	{"batch/claim-many", func(t *testing.T, s *suite) {
		free, mine, other, done, reused := s.key(), s.key(), s.key(), s.key(), s.key()
		s.claim(mine, "A", "")
		s.claim(other, "X", "")
		s.mark(done, "X", "fp1")
		s.mark(reused, "X", "fp1")
		got, err := s.b.Store.Claim(s.ctx, []driver.Entry{
			{Key: free, Token: "A", TTL: cLease},
			{Key: mine, Token: "A", TTL: cLease},
			{Key: other, Token: "A", TTL: cLease},
			{Key: done, Token: "A", Fingerprint: "fp1", TTL: cLease},
			{Key: reused, Token: "A", Fingerprint: "fp2", TTL: cLease},
		})
		s.must(err)
		want := []driver.Status{driver.StatusAcquired, driver.StatusAcquired, driver.StatusInProgress, driver.StatusDuplicate, driver.StatusConflict}
		for i, a := range got {
			if a.Err != nil || a.Status != want[i] {
				t.Fatalf("entry %d: %v %v, want %v", i, a.Status, a.Err, want[i])
			}
		}
		if got[2].TTL <= 0 || got[2].TTL > cLease {
			t.Fatalf("remaining lease %v", got[2].TTL)
		}
		for _, k := range []string{free, mine} {
			s.checkTTL(k)
		}
	}},
	{"batch/claim-many-renews-mine", func(t *testing.T, s *suite) {
		mine, other := s.key(), s.key()
		s.claim(mine, "A", "")
		s.claim(other, "X", "")
		s.b.Advance(cLease - cMargin)
		got, err := s.b.Store.Claim(s.ctx, []driver.Entry{{Key: mine, Token: "A", TTL: cLease}, {Key: other, Token: "A", TTL: cLease}})
		s.must(err)
		if got[0].Err != nil || got[0].Status != driver.StatusAcquired || got[1].Err != nil || got[1].Status != driver.StatusInProgress {
			t.Fatalf("got %+v, want Acquired then InProgress", got)
		}
		if got[1].TTL <= 0 || got[1].TTL > cMargin+cMargin/2 {
			t.Fatalf("other's remaining lease %v, want about %v", got[1].TTL, cMargin)
		}
		// the retried claim renewed the lease; the other one's ran out
		s.b.Advance(2 * cMargin)
		s.wantStatus(s.claim(mine, "B", ""), driver.StatusInProgress)
		s.wantStatus(s.claim(other, "B", ""), driver.StatusAcquired)
	}},
	{"batch/mark-many", func(t *testing.T, s *suite) {
		free, other, mine, reused := s.key(), s.key(), s.key(), s.key()
		s.claim(other, "X", "")
		s.mark(mine, "A", "")
		s.mark(reused, "X", "fp1")
		got, err := s.b.Store.Mark(s.ctx, []driver.Entry{
			{Key: free, Token: "A", TTL: cRetention},
			{Key: other, Token: "A", TTL: cRetention},
			{Key: mine, Token: "A", TTL: cRetention},
			{Key: reused, Token: "A", Fingerprint: "fp2", TTL: cRetention},
		})
		s.must(err)
		want := []driver.Status{driver.StatusAcquired, driver.StatusInProgress, driver.StatusAcquired, driver.StatusConflict}
		for i, a := range got {
			if a.Err != nil || a.Status != want[i] {
				t.Fatalf("entry %d: %v %v, want %v", i, a.Status, a.Err, want[i])
			}
		}
		s.checkTTL(free)
	}},
	{"batch/complete-many", func(t *testing.T, s *suite) {
		mine, other, absent := s.key(), s.key(), s.key()
		s.claim(mine, "A", "")
		s.claim(other, "X", "")
		got, err := s.b.Store.Complete(s.ctx, []driver.Entry{
			{Key: mine, Token: "A", TTL: cRetention},
			{Key: other, Token: "A", TTL: cRetention},
			{Key: absent, Token: "A", TTL: cRetention},
		})
		s.must(err)
		if got[0] != nil || got[1] != nil || got[2] != nil {
			t.Fatalf("got %v, want DONE written for each", got)
		}
		for _, k := range []string{mine, other, absent} {
			s.wantStatus(s.claim(k, "B", ""), driver.StatusDuplicate)
		}
		s.checkTTL(mine)
	}},
	{"batch/extend-many", func(t *testing.T, s *suite) {
		mine, other, done, absent := s.key(), s.key(), s.key(), s.key()
		s.claim(mine, "A", "")
		s.claim(other, "X", "")
		s.claim(done, "A", "")
		s.must(s.complete(done, "A"))
		s.b.Advance(cLease - cMargin)
		got, err := s.b.Store.Extend(s.ctx, []driver.Entry{
			{Key: mine, Token: "A", TTL: cLease},
			{Key: other, Token: "A", TTL: cLease},
			{Key: done, Token: "A", TTL: cLease},
			{Key: absent, Token: "A", TTL: cLease},
		})
		s.must(err)
		if len(got) != 4 || got[0] != nil || !errors.Is(got[1], driver.ErrLeaseLost) || !errors.Is(got[2], driver.ErrLeaseLost) || !errors.Is(got[3], driver.ErrLeaseLost) {
			t.Fatalf("got %v, want nil, then driver.ErrLeaseLost three times", got)
		}
		s.checkTTL(mine)
		// mine outlives its first lease; the other one's ran out
		s.b.Advance(2 * cMargin)
		s.wantStatus(s.claim(mine, "B", ""), driver.StatusInProgress)
		s.wantStatus(s.claim(other, "B", ""), driver.StatusAcquired)
		s.wantStatus(s.claim(done, "B", ""), driver.StatusDuplicate)
	}},
	{"batch/release-many", func(t *testing.T, s *suite) {
		mine, other, done, absent := s.key(), s.key(), s.key(), s.key()
		s.claim(mine, "A", "")
		s.claim(other, "X", "")
		s.claim(done, "A", "")
		s.must(s.complete(done, "A"))
		got, err := s.b.Store.Release(s.ctx, []driver.Entry{
			{Key: mine, Token: "A"}, {Key: other, Token: "A"}, {Key: done, Token: "A"}, {Key: absent, Token: "A"},
		})
		s.must(err)
		if len(got) != 4 || got[0] != nil || got[1] != nil || got[2] != nil || got[3] != nil {
			t.Fatalf("got %v, want four nils", got)
		}
		s.wantStatus(s.claim(mine, "B", ""), driver.StatusAcquired)
		s.wantStatus(s.claim(other, "B", ""), driver.StatusInProgress)
		s.wantStatus(s.claim(done, "B", ""), driver.StatusDuplicate)
		s.wantStatus(s.claim(absent, "B", ""), driver.StatusAcquired)
	}},
	{"batch/empty", func(t *testing.T, s *suite) {
		a, err := s.b.Store.Claim(s.ctx, nil)
		s.must(err)
		m, err := s.b.Store.Mark(s.ctx, nil)
		s.must(err)
		c, err := s.b.Store.Complete(s.ctx, nil)
		s.must(err)
		x, err := s.b.Store.Extend(s.ctx, nil)
		s.must(err)
		r, err := s.b.Store.Release(s.ctx, nil)
		s.must(err)
		if len(a)+len(m)+len(c)+len(x)+len(r) != 0 {
			t.Fatal("answers for no entries")
		}
	}},
	{"invalid-input", func(t *testing.T, s *suite) {
		k, other := s.key(), s.key()
		// a bad entry refuses the whole call, with no answers
		invalid := func(what string, answers int, err error) {
			t.Helper()
			if !errors.Is(err, driver.ErrInvalidOption) || answers != 0 {
				t.Fatalf("%s: %d answers, err %v; want driver.ErrInvalidOption alone", what, answers, err)
			}
		}
		for _, tok := range []string{"", "a:b", string(make([]byte, storekit.MaxTokenLen+1))} {
			a, err := s.b.Store.Claim(s.ctx, one(k, tok, "", cLease))
			invalid("claim with token "+strconv.Quote(tok), len(a), err)
			m, err := s.b.Store.Mark(s.ctx, one(k, tok, "", cRetention))
			invalid("mark with token "+strconv.Quote(tok), len(m), err)
			c, err := s.b.Store.Complete(s.ctx, one(k, tok, "", cRetention))
			invalid("complete with token "+strconv.Quote(tok), len(c), err)
			x, err := s.b.Store.Extend(s.ctx, one(k, tok, "", cLease))
			invalid("extend with token "+strconv.Quote(tok), len(x), err)
			r, err := s.b.Store.Release(s.ctx, one(k, tok, "", cLease))
			invalid("release with token "+strconv.Quote(tok), len(r), err)
		}
		a, err := s.b.Store.Claim(s.ctx, one(k, "A", "", 0))
		invalid("zero lease", len(a), err)
		m, err := s.b.Store.Mark(s.ctx, one(k, "A", "", -time.Second))
		invalid("negative retention", len(m), err)
		c, err := s.b.Store.Complete(s.ctx, one(k, "A", "", time.Millisecond-1))
		invalid("retention below 1ms", len(c), err)
		x, err := s.b.Store.Extend(s.ctx, one(k, "A", "", 0))
		invalid("zero extension", len(x), err)
		a, err = s.b.Store.Claim(s.ctx, []driver.Entry{{Key: k, Token: "A"}})
		invalid("batch without ttl", len(a), err)
		// one bad entry after a good one: nothing of the batch is written
		a, err = s.b.Store.Claim(s.ctx, []driver.Entry{{Key: other, Token: "A", TTL: cLease}, {Key: k, Token: "A"}})
		invalid("claim batch with a bad entry", len(a), err)
		m, err = s.b.Store.Mark(s.ctx, []driver.Entry{{Key: other, Token: "A", TTL: cRetention}, {Key: k, Token: "a:b", TTL: cRetention}})
		invalid("mark batch with a bad entry", len(m), err)
		s.wantStatus(s.claim(k, "A", ""), driver.StatusAcquired) // nothing was written
		s.wantStatus(s.claim(other, "B", ""), driver.StatusAcquired)
		// nor released, extended or completed
		r, err := s.b.Store.Release(s.ctx, []driver.Entry{{Key: k, Token: "A"}, {Key: other, Token: ""}})
		invalid("release batch with a bad entry", len(r), err)
		x, err = s.b.Store.Extend(s.ctx, []driver.Entry{{Key: k, Token: "A", TTL: cLease}, {Key: other, Token: "B"}})
		invalid("extend batch with a bad entry", len(x), err)
		c, err = s.b.Store.Complete(s.ctx, []driver.Entry{{Key: k, Token: "A", TTL: cRetention}, {Key: other, Token: "B"}})
		invalid("complete batch with a bad entry", len(c), err)
		s.wantStatus(s.claim(k, "C", ""), driver.StatusInProgress)
		s.wantStatus(s.claim(other, "C", ""), driver.StatusInProgress)
	}},
	{"lookup/states", func(t *testing.T, s *suite) {
		absent, inProgress, done := s.key(), s.key(), s.key()
		s.claim(inProgress, "A", "fp1")
		s.claim(done, "B", "fp2")
		s.must(s.complete(done, "B"))
		got := s.lookup(absent, inProgress, done)
		if got[0] != (driver.Record{}) {
			t.Fatalf("absent: %+v", got[0])
		}
		s.wantRecord(got[1], driver.RecordInProgress, "A", "fp1", cLease)
		s.wantRecord(got[2], driver.RecordDone, "B", "fp2", cRetention)
		// Lookup writes nothing: the claim is still A's, the DONE record unchanged
		s.wantStatus(s.claim(inProgress, "C", ""), driver.StatusInProgress)
		s.wantStatus(s.claim(done, "C", "fp2"), driver.StatusDuplicate)
		s.wantStatus(s.claim(absent, "C", ""), driver.StatusAcquired)
	}},
	{"lookup/empty", func(t *testing.T, s *suite) {
		rs, err := s.records().Lookup(s.ctx, nil)
		s.must(err)
		if len(rs) != 0 {
			t.Fatalf("records for no keys: %v", rs)
		}
	}},
	{"forget/done", func(t *testing.T, s *suite) {
		k := s.key()
		s.mark(k, "A", "fp1")
		got := s.forget(false, k)
		s.wantRecord(got[0], driver.RecordDone, "A", "fp1", cRetention)
		if r := s.lookup(k)[0]; r.State != driver.RecordAbsent {
			t.Fatalf("after Forget: %+v", r)
		}
		s.wantStatus(s.mark(k, "B", "fp2"), driver.StatusAcquired) // runs again, another payload too
	}},
	{"forget/absent", func(t *testing.T, s *suite) {
		k := s.key()
		got := s.forget(false, k)
		if got[0].State != driver.RecordAbsent || got[0].Err != nil {
			t.Fatalf("forget of an absent record: %+v", got[0])
		}
		s.wantStatus(s.claim(k, "A", ""), driver.StatusAcquired)
	}},
	{"forget/in-progress", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		got := s.forget(false, k)
		if !errors.Is(got[0].Err, driver.ErrRecordInProgress) {
			t.Fatalf("forget of a record in progress: err %v, want driver.ErrRecordInProgress", got[0].Err)
		}
		s.wantRecord(got[0], driver.RecordInProgress, "A", "", cLease)
		s.wantStatus(s.claim(k, "B", ""), driver.StatusInProgress) // left alone
		s.must(s.extend(k, "A"))
		got = s.forget(true, k)
		if got[0].Err != nil || got[0].State != driver.RecordInProgress {
			t.Fatalf("forced forget: %+v", got[0])
		}
		s.wantLeaseLost(s.extend(k, "A")) // the owner's heartbeat finds its lease lost
		s.wantStatus(s.claim(k, "B", ""), driver.StatusAcquired)
		s.must(s.release(k, "B"))
		s.claim(k, "C", "")
		s.forget(true, k)
		s.must(s.complete(k, "C")) // a run forgotten mid-way that succeeds writes DONE
		s.wantStatus(s.claim(k, "D", ""), driver.StatusDuplicate)
	}},
	{"forget/many", func(t *testing.T, s *suite) {
		done, inProgress, absent := s.key(), s.key(), s.key()
		s.mark(done, "A", "")
		s.claim(inProgress, "A", "")
		got := s.forget(false, done, inProgress, absent)
		if got[0].Err != nil || got[0].State != driver.RecordDone || !errors.Is(got[1].Err, driver.ErrRecordInProgress) ||
			got[2].Err != nil || got[2].State != driver.RecordAbsent {
			t.Fatalf("got %+v", got)
		}
		s.wantStatus(s.mark(done, "B", ""), driver.StatusAcquired)
		s.wantStatus(s.mark(inProgress, "B", ""), driver.StatusInProgress)
	}},
	{"forget/not-a-record-key", func(t *testing.T, s *suite) {
		for _, k := range []string{"", "nocolon", "prefix:handler-only"} {
			if _, err := s.records().Forget(s.ctx, []string{s.key(), k}, false); !errors.Is(err, driver.ErrInvalidOption) {
				t.Fatalf("Forget(%q): err %v, want driver.ErrInvalidOption", k, err)
			}
		}
	}},
	{"hostile-fingerprint", func(t *testing.T, s *suite) {
		k := s.key()
		fp := "a:b:c\x00\xff"
		s.claim(k, "A", fp)
		s.must(s.complete(k, "A"))
		s.wantStatus(s.claim(k, "B", fp), driver.StatusDuplicate)
		s.wantStatus(s.claim(k, "B", fp+"x"), driver.StatusConflict)
	}},
}

// replyCases are the conformance cases of stored replies: a reply that Complete
// writes with DONE comes back with every duplicate's claim, byte for byte.
var replyCases = []conformanceCase{
	{"reply/complete", func(t *testing.T, s *suite) {
		k := s.key()
		reply := "\x00{\"id\":7}\r\n:d:x:\xff" // binary, separators, CRLF
		s.claim(k, "A", "fp1")
		s.must(s.completeReply(k, "A", reply))
		a := s.claim(k, "B", "fp1")
		s.wantStatus(a, driver.StatusDuplicate)
		if !a.HasReply || a.Reply != reply || a.TTL <= 0 || a.TTL > cRetention {
			t.Fatalf("duplicate's answer %+v, want the reply %q and a TTL in (0, %v]", a, reply, cRetention)
		}
		if s.b.Raw != nil { // the record's form: r:<token>:<len(fingerprint)>:<fingerprint><reply>
			if v, _ := s.b.Raw.Get(s.ctx, k); v != "r:A:3:fp1"+reply {
				t.Fatalf("record value %q", v)
			}
		}
		s.wantStatus(s.claim(k, "B", "fp2"), driver.StatusConflict)
		if a := s.claim(k, "B", ""); !a.HasReply || a.Reply != reply {
			t.Fatalf("unfingerprinted duplicate: %+v", a)
		}
		s.must(s.completeReply(k, "A", reply)) // retried, its first attempt landed
		s.wantLeaseLost(s.completeReply(k, "B", reply))
		s.wantLeaseLost(s.extend(k, "A"))
		s.must(s.release(k, "A"))
		s.wantStatus(s.mark(k, "B", ""), driver.StatusDuplicate)
		s.wantStatus(s.mark(k, "A", ""), driver.StatusAcquired) // a mark finds its own token
		r := s.lookup(k)[0]
		if r.State != driver.RecordDone || r.Owner != "A" || r.Fingerprint != "fp1" || !r.HasReply || r.ReplySize != len(reply) {
			t.Fatalf("lookup: %+v", r)
		}
		s.b.Advance(cRetention + cMargin)
		s.wantStatus(s.claim(k, "C", ""), driver.StatusAcquired)
	}},
	{"reply/empty-and-none", func(t *testing.T, s *suite) {
		empty, none := s.key(), s.key()
		s.claim(empty, "A", "")
		s.claim(none, "A", "")
		s.must(s.completeReply(empty, "A", ""))
		s.must(s.complete(none, "A"))
		if a := s.claim(empty, "B", ""); a.Status != driver.StatusDuplicate || !a.HasReply || a.Reply != "" {
			t.Fatalf("empty reply: %+v", a)
		}
		if a := s.claim(none, "B", ""); a.Status != driver.StatusDuplicate || a.HasReply {
			t.Fatalf("no reply: %+v", a)
		}
		got := s.lookup(empty, none)
		if !got[0].HasReply || got[0].ReplySize != 0 || got[1].HasReply {
			t.Fatalf("lookup: %+v", got)
		}
	}},
	{"reply/hostile-fingerprint", func(t *testing.T, s *suite) {
		k := s.key()
		fp := "a:b:3:c\x00\xff"
		s.claim(k, "A", fp)
		s.must(s.completeReply(k, "A", "7:x:"))
		if a := s.claim(k, "B", fp); a.Status != driver.StatusDuplicate || a.Reply != "7:x:" {
			t.Fatalf("got %+v", a)
		}
		s.wantStatus(s.claim(k, "B", fp+"x"), driver.StatusConflict)
		if r := s.lookup(k)[0]; r.Fingerprint != fp || r.ReplySize != 4 {
			t.Fatalf("lookup: %+v", r)
		}
	}},
	{"reply/largest", func(t *testing.T, s *suite) {
		k := s.key()
		reply := strings.Repeat("\xfe:", maxReply/2)
		s.claim(k, "A", "2d711642b726b04401627ca9fbac32f5") // a fingerprint as dedup.Fingerprint makes it
		s.must(s.completeReply(k, "A", reply))
		if a := s.claim(k, "B", ""); !a.HasReply || a.Reply != reply {
			t.Fatalf("a %d-byte reply came back as %d bytes (has %v)", len(reply), len(a.Reply), a.HasReply)
		}
		// two entries, so that a store's batch form answers it too
		got, err := s.b.Store.Claim(s.ctx, []driver.Entry{{Key: k, Token: "B", TTL: cLease}, {Key: s.key(), Token: "B", TTL: cLease}})
		s.must(err)
		if got[0].Err != nil || !got[0].HasReply || got[0].Reply != reply || got[1].Err != nil || got[1].Status != driver.StatusAcquired {
			t.Fatalf("Claim of two: %d bytes (has %v, err %v), then %v %v", len(got[0].Reply), got[0].HasReply, got[0].Err, got[1].Status, got[1].Err)
		}
	}},
	{"reply/batch", func(t *testing.T, s *suite) {
		withReply, without, other, absent := s.key(), s.key(), s.key(), s.key()
		for _, k := range []string{withReply, without} {
			s.claim(k, "A", "")
		}
		s.claim(other, "X", "")
		errs, err := s.b.Store.Complete(s.ctx, []driver.Entry{
			{Key: withReply, Token: "A", TTL: cRetention, Reply: "one", HasReply: true},
			{Key: without, Token: "A", TTL: cRetention},
			{Key: other, Token: "A", TTL: cRetention, Reply: "two", HasReply: true},
			{Key: absent, Token: "A", TTL: cRetention, Reply: "three", HasReply: true},
		})
		s.must(err)
		if errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], driver.ErrLeaseLost) || !errors.Is(errs[3], driver.ErrLeaseLost) {
			t.Fatalf("Complete of two: %v", errs)
		}
		s.checkTTL(withReply)
		got, err := s.b.Store.Claim(s.ctx, []driver.Entry{
			{Key: withReply, Token: "B", TTL: cLease},
			{Key: without, Token: "B", TTL: cLease},
			{Key: other, Token: "B", TTL: cLease},
			{Key: absent, Token: "B", TTL: cLease},
		})
		s.must(err)
		if got[0].Status != driver.StatusDuplicate || !got[0].HasReply || got[0].Reply != "one" || got[0].TTL <= 0 ||
			got[1].Status != driver.StatusDuplicate || got[1].HasReply || got[2].Status != driver.StatusInProgress || got[2].HasReply ||
			got[3].Status != driver.StatusAcquired {
			t.Fatalf("Claim of two: %+v", got)
		}
		// a batch that names a key twice
		got, err = s.b.Store.Claim(s.ctx, []driver.Entry{{Key: withReply, Token: "C", TTL: cLease}, {Key: withReply, Token: "D", TTL: cLease}})
		s.must(err)
		for _, a := range got {
			if a.Status != driver.StatusDuplicate || a.Reply != "one" {
				t.Fatalf("repeated key: %+v", got)
			}
		}
	}},
	{"reply/forget", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.must(s.completeReply(k, "A", "reply"))
		got := s.forget(false, k)
		if got[0].Err != nil || got[0].State != driver.RecordDone || got[0].ReplySize != 5 {
			t.Fatalf("forget: %+v", got[0])
		}
		s.wantStatus(s.claim(k, "B", ""), driver.StatusAcquired)
	}},
}

// foreignCase: a value under a record key that dedup did not write is reported, never
// taken for a record (which could drop a message) and never overwritten.
var foreignCase = conformanceCase{"foreign-value", func(t *testing.T, s *suite) {
	if s.b.Raw == nil {
		t.Skip("no Raw access")
	}
	ctx := s.ctx
	k := s.key()
	if err := s.b.Raw.Set(ctx, k, "hello", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := only(s.b.Store.Claim(ctx, one(k, "A", "", cLease))); !errors.Is(err, driver.ErrBadRecord) || !errors.Is(err, driver.ErrStoreUnavailable) {
		t.Fatalf("claim: %v", err)
	}
	if _, err := only(s.b.Store.Mark(ctx, one(k, "A", "", cRetention))); !errors.Is(err, driver.ErrBadRecord) {
		t.Fatalf("mark: %v", err)
	}
	// in a batch of several, it fails that entry alone
	got, err := s.b.Store.Claim(ctx, []driver.Entry{{Key: k, Token: "A", TTL: cLease}, {Key: s.key(), Token: "A", TTL: cLease}})
	if err != nil || !errors.Is(got[0].Err, driver.ErrBadRecord) || got[1].Err != nil || got[1].Status != driver.StatusAcquired {
		t.Fatalf("claim of two: %v %+v", err, got)
	}
	rs := s.records()
	if got, err := rs.Lookup(ctx, []string{k}); err != nil || !errors.Is(got[0].Err, driver.ErrBadRecord) {
		t.Fatalf("lookup: %v %+v", err, got)
	}
	for _, force := range []bool{false, true} {
		if got, err := rs.Forget(ctx, []string{k}, force); err != nil || !errors.Is(got[0].Err, driver.ErrBadRecord) {
			t.Fatalf("forget (force %v): %v %+v", force, err, got)
		}
	}
	if v, _ := s.b.Raw.Get(ctx, k); v != "hello" {
		t.Fatalf("value overwritten: %q", v)
	}
}}
