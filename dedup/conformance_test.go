package dedup

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/internal/testenv"
)

// backend is one Store under test, with a way to move its time forward.
type backend struct {
	store   Store
	prefix  string
	advance func(time.Duration)
	// rdb is the Redis client behind a Redis store (nil for memory): the suite checks
	// raw values and TTLs through it.
	rdb redis.UniversalClient
}

type backendFactory struct {
	name string
	new  func(t *testing.T) backend
}

// storeBackends lists every Store the conformance suite runs against. The real
// redis-server comes from DEDUP_REDIS_ADDR or is spawned, the 3-master Redis Cluster
// is spawned; without redis-server they skip (and fail under DEDUP_REQUIRE_SERVERS=1).
func storeBackends() []backendFactory {
	return []backendFactory{
		{"memory", func(t *testing.T) backend {
			clk := newFakeClock()
			s, err := NewMemoryStore(WithMemoryClock(clk.Now))
			if err != nil {
				t.Fatal(err)
			}
			return backend{store: s, prefix: testenv.Prefix(), advance: clk.Add}
		}},
		{"miniredis", func(t *testing.T) backend {
			m, c := newMiniredis(t)
			s, err := NewRedisStore(c)
			if err != nil {
				t.Fatal(err)
			}
			return backend{store: s, prefix: testenv.Prefix(), advance: m.FastForward, rdb: c}
		}},
		{"redis-server", func(t *testing.T) backend {
			prefix := testenv.Prefix()
			c := realRedis(t, prefix)
			s, err := NewRedisStore(c)
			if err != nil {
				t.Fatal(err)
			}
			return backend{store: s, prefix: prefix, advance: time.Sleep, rdb: c}
		}},
		{"redis-cluster", clusterBackend},
	}
}

// Durations are short so that the real server, which can only sleep, stays fast; the
// margins are wide so that a loaded machine does not flake.
const (
	cLease     = 400 * time.Millisecond
	cRetention = 1200 * time.Millisecond
	cMargin    = 150 * time.Millisecond
)

func TestEveryStorePassesTheConformanceSuite(t *testing.T) {
	for _, bf := range storeBackends() {
		t.Run(bf.name, func(t *testing.T) {
			t.Parallel()
			for _, c := range append(conformanceCases, replyCases...) {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					b := bf.new(t)
					c.run(t, &suite{t: t, b: b, ctx: context.Background()})
				})
			}
		})
	}
}

type suite struct {
	t   *testing.T
	b   backend
	ctx context.Context
	n   int
}

func (s *suite) key() string {
	s.n++
	return s.b.prefix + ":h:" + s.t.Name() + string(rune('a'+s.n))
}

func (s *suite) claim(key, token, fp string) Answer {
	s.t.Helper()
	a, err := s.b.store.Claim(s.ctx, key, token, fp, cLease)
	if err != nil {
		s.t.Fatalf("Claim: %v", err)
	}
	s.checkTTL(key)
	return a
}

func (s *suite) mark(key, token, fp string) Answer {
	s.t.Helper()
	a, err := s.b.store.Mark(s.ctx, key, token, fp, cRetention)
	if err != nil {
		s.t.Fatalf("Mark: %v", err)
	}
	s.checkTTL(key)
	return a
}

func (s *suite) complete(key, token string) error {
	s.t.Helper()
	err := s.b.store.Complete(s.ctx, key, token, cRetention)
	s.checkTTL(key)
	return err
}

func (s *suite) records() RecordStore {
	s.t.Helper()
	rs, ok := s.b.store.(RecordStore)
	if !ok {
		s.t.Fatalf("%T does not implement RecordStore", s.b.store)
	}
	return rs
}

func (s *suite) lookup(keys ...string) []Record {
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

func (s *suite) forget(force bool, keys ...string) []Record {
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
func (s *suite) wantRecord(r Record, state RecordState, owner, fp string, max time.Duration) {
	s.t.Helper()
	if r.Err != nil && state != RecordInProgress || r.State != state || r.Owner != owner || r.Fingerprint != fp ||
		r.TTL <= 0 || r.TTL > max || r.ReplySize != 0 {
		s.t.Fatalf("record %+v, want %v owned by %q, fingerprint %q, TTL in (0, %v], no reply", r, state, owner, fp, max)
	}
}

func (s *suite) wantStatus(a Answer, want Status) {
	s.t.Helper()
	if a.Status != want {
		s.t.Fatalf("status %v, want %v", a.Status, want)
	}
}

// checkTTL asserts the Redis-side rule that no record lives forever.
func (s *suite) checkTTL(key string) {
	s.t.Helper()
	if s.b.rdb == nil {
		return
	}
	ttl, err := s.b.rdb.PTTL(s.ctx, key).Result()
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
	if !errors.Is(err, ErrLeaseLost) {
		s.t.Fatalf("err %v, want ErrLeaseLost", err)
	}
}

var conformanceCases = []struct {
	name string
	run  func(t *testing.T, s *suite)
}{
	{"claim/absent", func(t *testing.T, s *suite) {
		k := s.key()
		s.wantStatus(s.claim(k, "A", ""), StatusAcquired)
	}},
	{"claim/in-progress-mine", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.b.advance(cLease - cMargin)
		s.wantStatus(s.claim(k, "A", ""), StatusAcquired)
		// the retried claim renewed the lease
		s.b.advance(2 * cMargin)
		s.wantStatus(s.claim(k, "B", ""), StatusInProgress)
	}},
	{"claim/in-progress-other", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		a := s.claim(k, "B", "")
		s.wantStatus(a, StatusInProgress)
		if a.TTL <= 0 || a.TTL > cLease {
			t.Fatalf("remaining lease %v, want in (0, %v]", a.TTL, cLease)
		}
	}},
	{"claim/done", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "fp1")
		s.must(s.complete(k, "A"))
		a := s.claim(k, "B", "fp1")
		s.wantStatus(a, StatusDuplicate)
		if a.TTL <= 0 || a.TTL > cRetention {
			t.Fatalf("DONE record's remaining life %v, want in (0, %v]", a.TTL, cRetention)
		}
		s.wantStatus(s.claim(k, "B", ""), StatusDuplicate)
		s.wantStatus(s.claim(k, "A", "fp1"), StatusDuplicate)
	}},
	{"claim/done-other-fingerprint", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "fp1")
		s.must(s.complete(k, "A"))
		s.wantStatus(s.claim(k, "B", "fp2"), StatusConflict)
	}},
	{"claim/lease-expiry", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.b.advance(cLease + cMargin)
		s.wantStatus(s.claim(k, "B", ""), StatusAcquired)
		s.wantLeaseLost(s.complete(k, "A"))
		s.must(s.complete(k, "B"))
	}},
	{"complete/absent", func(t *testing.T, s *suite) {
		s.wantLeaseLost(s.complete(s.key(), "A"))
	}},
	{"complete/in-progress-mine", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.must(s.complete(k, "A"))
		// DONE lives for the retention, not the lease
		s.b.advance(cRetention - cMargin)
		s.wantStatus(s.claim(k, "B", ""), StatusDuplicate)
		s.b.advance(2 * cMargin)
		s.wantStatus(s.claim(k, "B", ""), StatusAcquired)
	}},
	{"complete/in-progress-other", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.wantLeaseLost(s.complete(k, "B"))
		s.wantStatus(s.claim(k, "C", ""), StatusInProgress)
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
		s.wantLeaseLost(s.complete(k, "B"))
	}},
	{"release/absent", func(t *testing.T, s *suite) {
		k := s.key()
		s.must(s.b.store.Release(s.ctx, k, "A"))
		s.wantStatus(s.claim(k, "B", ""), StatusAcquired)
	}},
	{"release/in-progress-mine", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.must(s.b.store.Release(s.ctx, k, "A"))
		s.wantStatus(s.claim(k, "B", ""), StatusAcquired)
	}},
	{"release/in-progress-other", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.must(s.b.store.Release(s.ctx, k, "B"))
		s.wantStatus(s.claim(k, "C", ""), StatusInProgress)
	}},
	{"release/done", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.must(s.complete(k, "A"))
		s.must(s.b.store.Release(s.ctx, k, "A"))
		s.wantStatus(s.claim(k, "B", ""), StatusDuplicate)
	}},
	{"extend/absent", func(t *testing.T, s *suite) {
		s.wantLeaseLost(s.b.store.Extend(s.ctx, s.key(), "A", cLease))
	}},
	{"extend/in-progress-mine", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.b.advance(cLease - cMargin)
		s.must(s.b.store.Extend(s.ctx, k, "A", cLease))
		s.checkTTL(k)
		s.b.advance(2 * cMargin) // past the first lease, inside the extended one
		s.wantStatus(s.claim(k, "B", ""), StatusInProgress)
		s.must(s.complete(k, "A"))
	}},
	{"extend/in-progress-other", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.wantLeaseLost(s.b.store.Extend(s.ctx, k, "B", cLease))
	}},
	{"extend/done", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.must(s.complete(k, "A"))
		s.wantLeaseLost(s.b.store.Extend(s.ctx, k, "A", cLease))
	}},
	{"mark/absent", func(t *testing.T, s *suite) {
		k := s.key()
		s.wantStatus(s.mark(k, "A", ""), StatusAcquired)
		s.wantStatus(s.claim(k, "B", ""), StatusDuplicate) // the mark wrote DONE
		s.b.advance(cRetention + cMargin)
		s.wantStatus(s.mark(k, "C", ""), StatusAcquired)
	}},
	{"mark/in-progress-other", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.wantStatus(s.mark(k, "B", ""), StatusInProgress)
		s.must(s.complete(k, "A")) // the mark did not disturb the claim
		s.wantStatus(s.mark(k, "B", ""), StatusDuplicate)
	}},
	{"mark/done-mine-retried", func(t *testing.T, s *suite) {
		k := s.key()
		s.mark(k, "A", "")
		s.wantStatus(s.mark(k, "A", ""), StatusAcquired)
	}},
	{"mark/done-other", func(t *testing.T, s *suite) {
		k := s.key()
		s.mark(k, "A", "fp1")
		s.wantStatus(s.mark(k, "B", "fp1"), StatusDuplicate)
		s.wantStatus(s.mark(k, "B", "fp2"), StatusConflict)
		s.wantStatus(s.mark(k, "B", ""), StatusDuplicate)
	}},
	{"batch/claim-many", func(t *testing.T, s *suite) {
		free, mine, other, done, reused := s.key(), s.key(), s.key(), s.key(), s.key()
		s.claim(mine, "A", "")
		s.claim(other, "X", "")
		s.mark(done, "X", "fp1")
		s.mark(reused, "X", "fp1")
		got, err := s.b.store.ClaimMany(s.ctx, []Entry{
			{Key: free, Token: "A", TTL: cLease},
			{Key: mine, Token: "A", TTL: cLease},
			{Key: other, Token: "A", TTL: cLease},
			{Key: done, Token: "A", Fingerprint: "fp1", TTL: cLease},
			{Key: reused, Token: "A", Fingerprint: "fp2", TTL: cLease},
		})
		s.must(err)
		want := []Status{StatusAcquired, StatusAcquired, StatusInProgress, StatusDuplicate, StatusConflict}
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
		s.b.advance(cLease - cMargin)
		got, err := s.b.store.ClaimMany(s.ctx, []Entry{{Key: mine, Token: "A", TTL: cLease}, {Key: other, Token: "A", TTL: cLease}})
		s.must(err)
		if got[0].Err != nil || got[0].Status != StatusAcquired || got[1].Err != nil || got[1].Status != StatusInProgress {
			t.Fatalf("got %+v, want Acquired then InProgress", got)
		}
		if got[1].TTL <= 0 || got[1].TTL > cMargin+cMargin/2 {
			t.Fatalf("other's remaining lease %v, want about %v", got[1].TTL, cMargin)
		}
		// the retried claim renewed the lease; the other one's ran out
		s.b.advance(2 * cMargin)
		s.wantStatus(s.claim(mine, "B", ""), StatusInProgress)
		s.wantStatus(s.claim(other, "B", ""), StatusAcquired)
	}},
	{"batch/mark-many", func(t *testing.T, s *suite) {
		free, other, mine, reused := s.key(), s.key(), s.key(), s.key()
		s.claim(other, "X", "")
		s.mark(mine, "A", "")
		s.mark(reused, "X", "fp1")
		got, err := s.b.store.MarkMany(s.ctx, []Entry{
			{Key: free, Token: "A", TTL: cRetention},
			{Key: other, Token: "A", TTL: cRetention},
			{Key: mine, Token: "A", TTL: cRetention},
			{Key: reused, Token: "A", Fingerprint: "fp2", TTL: cRetention},
		})
		s.must(err)
		want := []Status{StatusAcquired, StatusInProgress, StatusAcquired, StatusConflict}
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
		got, err := s.b.store.CompleteMany(s.ctx, []Entry{
			{Key: mine, Token: "A", TTL: cRetention},
			{Key: other, Token: "A", TTL: cRetention},
			{Key: absent, Token: "A", TTL: cRetention},
		})
		s.must(err)
		if got[0] != nil || !errors.Is(got[1], ErrLeaseLost) || !errors.Is(got[2], ErrLeaseLost) {
			t.Fatalf("got %v", got)
		}
		s.wantStatus(s.claim(mine, "B", ""), StatusDuplicate)
		s.checkTTL(mine)
	}},
	{"batch/empty", func(t *testing.T, s *suite) {
		a, err := s.b.store.ClaimMany(s.ctx, nil)
		s.must(err)
		m, err := s.b.store.MarkMany(s.ctx, nil)
		s.must(err)
		c, err := s.b.store.CompleteMany(s.ctx, nil)
		s.must(err)
		if len(a)+len(m)+len(c) != 0 {
			t.Fatal("answers for no entries")
		}
	}},
	{"invalid-input", func(t *testing.T, s *suite) {
		k := s.key()
		for _, tok := range []string{"", "a:b", string(make([]byte, maxTokenLen+1))} {
			if _, err := s.b.store.Claim(s.ctx, k, tok, "", cLease); !errors.Is(err, ErrInvalidOption) {
				t.Fatalf("token %q: err %v", tok, err)
			}
		}
		if _, err := s.b.store.Claim(s.ctx, k, "A", "", 0); !errors.Is(err, ErrInvalidOption) {
			t.Fatalf("zero lease: err %v", err)
		}
		if _, err := s.b.store.Mark(s.ctx, k, "A", "", -time.Second); !errors.Is(err, ErrInvalidOption) {
			t.Fatalf("negative retention: err %v", err)
		}
		if _, err := s.b.store.ClaimMany(s.ctx, []Entry{{Key: k, Token: "A"}}); !errors.Is(err, ErrInvalidOption) {
			t.Fatalf("batch without ttl: err %v", err)
		}
		s.wantStatus(s.claim(k, "A", ""), StatusAcquired) // nothing was written
	}},
	{"lookup/states", func(t *testing.T, s *suite) {
		absent, inProgress, done := s.key(), s.key(), s.key()
		s.claim(inProgress, "A", "fp1")
		s.claim(done, "B", "fp2")
		s.must(s.complete(done, "B"))
		got := s.lookup(absent, inProgress, done)
		if got[0] != (Record{}) {
			t.Fatalf("absent: %+v", got[0])
		}
		s.wantRecord(got[1], RecordInProgress, "A", "fp1", cLease)
		s.wantRecord(got[2], RecordDone, "B", "fp2", cRetention)
		// Lookup writes nothing: the claim is still A's, the DONE record unchanged
		s.wantStatus(s.claim(inProgress, "C", ""), StatusInProgress)
		s.wantStatus(s.claim(done, "C", "fp2"), StatusDuplicate)
		s.wantStatus(s.claim(absent, "C", ""), StatusAcquired)
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
		s.wantRecord(got[0], RecordDone, "A", "fp1", cRetention)
		if r := s.lookup(k)[0]; r.State != RecordAbsent {
			t.Fatalf("after Forget: %+v", r)
		}
		s.wantStatus(s.mark(k, "B", "fp2"), StatusAcquired) // runs again, another payload too
	}},
	{"forget/absent", func(t *testing.T, s *suite) {
		k := s.key()
		got := s.forget(false, k)
		if got[0].State != RecordAbsent || got[0].Err != nil {
			t.Fatalf("forget of an absent record: %+v", got[0])
		}
		s.wantStatus(s.claim(k, "A", ""), StatusAcquired)
	}},
	{"forget/in-progress", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		got := s.forget(false, k)
		if !errors.Is(got[0].Err, ErrRecordInProgress) {
			t.Fatalf("forget of a record in progress: err %v, want ErrRecordInProgress", got[0].Err)
		}
		s.wantRecord(got[0], RecordInProgress, "A", "", cLease)
		s.wantStatus(s.claim(k, "B", ""), StatusInProgress) // left alone
		s.must(s.b.store.Extend(s.ctx, k, "A", cLease))
		got = s.forget(true, k)
		if got[0].Err != nil || got[0].State != RecordInProgress {
			t.Fatalf("forced forget: %+v", got[0])
		}
		s.wantLeaseLost(s.complete(k, "A")) // the owner finds its lease lost
		s.wantStatus(s.claim(k, "B", ""), StatusAcquired)
	}},
	{"forget/many", func(t *testing.T, s *suite) {
		done, inProgress, absent := s.key(), s.key(), s.key()
		s.mark(done, "A", "")
		s.claim(inProgress, "A", "")
		got := s.forget(false, done, inProgress, absent)
		if got[0].Err != nil || got[0].State != RecordDone || !errors.Is(got[1].Err, ErrRecordInProgress) ||
			got[2].Err != nil || got[2].State != RecordAbsent {
			t.Fatalf("got %+v", got)
		}
		s.wantStatus(s.mark(done, "B", ""), StatusAcquired)
		s.wantStatus(s.mark(inProgress, "B", ""), StatusInProgress)
	}},
	{"forget/not-a-record-key", func(t *testing.T, s *suite) {
		for _, k := range []string{"", "nocolon", "prefix:handler-only"} {
			if _, err := s.records().Forget(s.ctx, []string{s.key(), k}, false); !errors.Is(err, ErrInvalidOption) {
				t.Fatalf("Forget(%q): err %v, want ErrInvalidOption", k, err)
			}
		}
	}},
	{"hostile-fingerprint", func(t *testing.T, s *suite) {
		k := s.key()
		fp := "a:b:c\x00\xff"
		s.claim(k, "A", fp)
		s.must(s.complete(k, "A"))
		s.wantStatus(s.claim(k, "B", fp), StatusDuplicate)
		s.wantStatus(s.claim(k, "B", fp+"x"), StatusConflict)
	}},
}

// replyCases are the conformance cases of ReplyStore: a reply written with DONE comes
// back with every duplicate's claim, byte for byte.
var replyCases = []struct {
	name string
	run  func(t *testing.T, s *suite)
}{
	{"reply/complete", func(t *testing.T, s *suite) {
		k := s.key()
		reply := "\x00{\"id\":7}\r\n:d:x:\xff" // binary, separators, CRLF
		s.claim(k, "A", "fp1")
		s.must(s.completeReply(k, "A", reply))
		a := s.claim(k, "B", "fp1")
		s.wantStatus(a, StatusDuplicate)
		if !a.HasReply || a.Reply != reply || a.TTL <= 0 || a.TTL > cRetention {
			t.Fatalf("duplicate's answer %+v, want the reply %q and a TTL in (0, %v]", a, reply, cRetention)
		}
		if s.b.rdb != nil { // the record's form: r:<token>:<len(fingerprint)>:<fingerprint><reply>
			if v := s.b.rdb.Get(s.ctx, k).Val(); v != "r:A:3:fp1"+reply {
				t.Fatalf("record value %q", v)
			}
		}
		s.wantStatus(s.claim(k, "B", "fp2"), StatusConflict)
		if a := s.claim(k, "B", ""); !a.HasReply || a.Reply != reply {
			t.Fatalf("unfingerprinted duplicate: %+v", a)
		}
		s.must(s.completeReply(k, "A", reply)) // retried, its first attempt landed
		s.must(s.complete(k, "A"))
		s.wantLeaseLost(s.completeReply(k, "B", reply))
		s.wantLeaseLost(s.b.store.Extend(s.ctx, k, "A", cLease))
		s.must(s.b.store.Release(s.ctx, k, "A"))
		s.wantStatus(s.mark(k, "B", ""), StatusDuplicate)
		s.wantStatus(s.mark(k, "A", ""), StatusAcquired) // a mark finds its own token
		r := s.lookup(k)[0]
		if r.State != RecordDone || r.Owner != "A" || r.Fingerprint != "fp1" || !r.HasReply || r.ReplySize != len(reply) {
			t.Fatalf("lookup: %+v", r)
		}
		s.b.advance(cRetention + cMargin)
		s.wantStatus(s.claim(k, "C", ""), StatusAcquired)
	}},
	{"reply/empty-and-none", func(t *testing.T, s *suite) {
		empty, none := s.key(), s.key()
		s.claim(empty, "A", "")
		s.claim(none, "A", "")
		s.must(s.completeReply(empty, "A", ""))
		s.must(s.complete(none, "A"))
		if a := s.claim(empty, "B", ""); a.Status != StatusDuplicate || !a.HasReply || a.Reply != "" {
			t.Fatalf("empty reply: %+v", a)
		}
		if a := s.claim(none, "B", ""); a.Status != StatusDuplicate || a.HasReply {
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
		if a := s.claim(k, "B", fp); a.Status != StatusDuplicate || a.Reply != "7:x:" {
			t.Fatalf("got %+v", a)
		}
		s.wantStatus(s.claim(k, "B", fp+"x"), StatusConflict)
		if r := s.lookup(k)[0]; r.Fingerprint != fp || r.ReplySize != 4 {
			t.Fatalf("lookup: %+v", r)
		}
	}},
	{"reply/largest", func(t *testing.T, s *suite) {
		k := s.key()
		reply := strings.Repeat("\xfe:", MaxReplyLimit/2)
		s.claim(k, "A", Fingerprint([]byte("x")))
		s.must(s.completeReply(k, "A", reply))
		if a := s.claim(k, "B", ""); !a.HasReply || a.Reply != reply {
			t.Fatalf("a %d-byte reply came back as %d bytes (has %v)", len(reply), len(a.Reply), a.HasReply)
		}
		got, err := s.b.store.ClaimMany(s.ctx, []Entry{{Key: k, Token: "B", TTL: cLease}})
		s.must(err)
		if !got[0].HasReply || got[0].Reply != reply {
			t.Fatalf("ClaimMany: %d bytes (has %v)", len(got[0].Reply), got[0].HasReply)
		}
	}},
	{"reply/batch", func(t *testing.T, s *suite) {
		withReply, without, other, absent := s.key(), s.key(), s.key(), s.key()
		for _, k := range []string{withReply, without} {
			s.claim(k, "A", "")
		}
		s.claim(other, "X", "")
		errs, err := s.b.store.CompleteMany(s.ctx, []Entry{
			{Key: withReply, Token: "A", TTL: cRetention, Reply: "one", HasReply: true},
			{Key: without, Token: "A", TTL: cRetention},
			{Key: other, Token: "A", TTL: cRetention, Reply: "two", HasReply: true},
			{Key: absent, Token: "A", TTL: cRetention, Reply: "three", HasReply: true},
		})
		s.must(err)
		if errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], ErrLeaseLost) || !errors.Is(errs[3], ErrLeaseLost) {
			t.Fatalf("CompleteMany: %v", errs)
		}
		s.checkTTL(withReply)
		got, err := s.b.store.ClaimMany(s.ctx, []Entry{
			{Key: withReply, Token: "B", TTL: cLease},
			{Key: without, Token: "B", TTL: cLease},
			{Key: other, Token: "B", TTL: cLease},
			{Key: absent, Token: "B", TTL: cLease},
		})
		s.must(err)
		if got[0].Status != StatusDuplicate || !got[0].HasReply || got[0].Reply != "one" || got[0].TTL <= 0 ||
			got[1].Status != StatusDuplicate || got[1].HasReply || got[2].Status != StatusInProgress || got[2].HasReply ||
			got[3].Status != StatusAcquired {
			t.Fatalf("ClaimMany: %+v", got)
		}
		// a batch that names a key twice goes as claim scripts
		got, err = s.b.store.ClaimMany(s.ctx, []Entry{{Key: withReply, Token: "C", TTL: cLease}, {Key: withReply, Token: "D", TTL: cLease}})
		s.must(err)
		for _, a := range got {
			if a.Status != StatusDuplicate || a.Reply != "one" {
				t.Fatalf("repeated key: %+v", got)
			}
		}
	}},
	{"reply/forget", func(t *testing.T, s *suite) {
		k := s.key()
		s.claim(k, "A", "")
		s.must(s.completeReply(k, "A", "reply"))
		got := s.forget(false, k)
		if got[0].Err != nil || got[0].State != RecordDone || got[0].ReplySize != 5 {
			t.Fatalf("forget: %+v", got[0])
		}
		s.wantStatus(s.claim(k, "B", ""), StatusAcquired)
	}},
}

func (s *suite) completeReply(key, token, reply string) error {
	s.t.Helper()
	rs, ok := s.b.store.(ReplyStore)
	if !ok {
		s.t.Fatalf("%T does not implement ReplyStore", s.b.store)
	}
	err := rs.CompleteReply(s.ctx, key, token, reply, cRetention)
	s.checkTTL(key)
	return err
}

// A value under a record key that dedup did not write is reported, never taken for a
// record (which could drop a message) and never overwritten.
func TestRedisStoreReportsAForeignValueAndNeverOverwritesIt(t *testing.T) {
	for _, bf := range storeBackends()[1:] {
		t.Run(bf.name, func(t *testing.T) {
			b := bf.new(t)
			ctx := context.Background()
			k := b.prefix + ":h:foreign"
			if err := b.rdb.Set(ctx, k, "hello", time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			if _, err := b.store.Claim(ctx, k, "A", "", cLease); !errors.Is(err, ErrBadRecord) || !errors.Is(err, ErrStoreUnavailable) {
				t.Fatalf("claim: %v", err)
			}
			if _, err := b.store.Mark(ctx, k, "A", "", cRetention); !errors.Is(err, ErrBadRecord) {
				t.Fatalf("mark: %v", err)
			}
			rs := b.store.(RecordStore)
			if got, err := rs.Lookup(ctx, []string{k}); err != nil || !errors.Is(got[0].Err, ErrBadRecord) {
				t.Fatalf("lookup: %v %+v", err, got)
			}
			for _, force := range []bool{false, true} {
				if got, err := rs.Forget(ctx, []string{k}, force); err != nil || !errors.Is(got[0].Err, ErrBadRecord) {
					t.Fatalf("forget (force %v): %v %+v", force, err, got)
				}
			}
			if v := b.rdb.Get(ctx, k).Val(); v != "hello" {
				t.Fatalf("value overwritten: %q", v)
			}
		})
	}
}
