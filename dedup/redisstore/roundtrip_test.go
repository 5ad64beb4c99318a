package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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
			// warm the script cache so the count is the steady state (two entries: a
			// batch of one takes the single calls' command and script)
			warm := []driver.Entry{{Key: prefix + ":h:warm", Token: "T", TTL: time.Minute}, {Key: prefix + ":h:warm2", Token: "T", TTL: time.Minute}}
			for range 2 { // the second finds the first's claims: the claim_many script
				if _, err := s.Claim(ctx, warm); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.Complete(ctx, withReply(warm)); err != nil { // the complete_many script
				t.Fatal(err)
			}
			// some keys already taken, so the answers differ and order matters
			for i := 0; i < n; i += 10 {
				if _, err := only(s.Mark(ctx, entry(entries[i].Key, "other", "", time.Minute))); err != nil {
					t.Fatal(err)
				}
			}
			tc.Reset()
			claims, err := s.Claim(ctx, entries)
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
			// with replies: one complete_many script call, which checks the owners
			withReplies := make([]driver.Entry, n)
			for i, e := range entries {
				e.Reply, e.HasReply = "r", true
				withReplies[i] = e
			}
			tc.Reset()
			errs, err := s.Complete(ctx, withReplies)
			if err != nil {
				t.Fatal(err)
			}
			testenv.ExpectTrips(t, "CompleteMany", tc, 1, 1)
			for i, e := range errs {
				if (i%10 == 0) != (e != nil) {
					t.Fatalf("complete %d: %v", i, e)
				}
			}
			completeWithoutReplies(t, s, tc, entries)
			for i := range entries {
				entries[i].Key += ":m"
			}
			tc.Reset()
			marks, err := s.Mark(ctx, entries)
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
	if _, err := only(s.Claim(ctx, entry("p:h:warm", "T", "", time.Minute))); err != nil {
		t.Fatal(err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	got, err := s.Claim(ctx, []driver.Entry{{Key: "p:h:a", Token: "T", TTL: time.Minute}, {Key: "p:h:b", Token: "T", TTL: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range got {
		if a.Err != nil || a.Status != driver.StatusAcquired {
			t.Fatalf("%v %v", a.Status, a.Err)
		}
	}
}

// A batch of one entry takes the single calls' path: one command or script in one
// round trip (a Claim that finds a record: the claim script in a second). Extend and
// Release of several entries are a script call per entry,
// in one round trip.
func TestBatchOfOneIsOneCommandAndSeveralOneRoundTrip(t *testing.T) {
	for name, mk := range countedRedis(t) {
		t.Run(name, func(t *testing.T) {
			s, tc, prefix := mk(t)
			ctx := context.Background()
			// warm the script cache and the probe, so that the counts are the steady state
			warm := prefix + ":h:warm"
			for _, tok := range []string{"T", "X"} { // X finds T's claim: the claim script
				if _, err := only(s.Claim(ctx, entry(warm, tok, "", time.Minute))); err != nil {
					t.Fatal(err)
				}
			}
			for _, err := range []error{
				onlyErr(s.Extend(ctx, entry(warm, "T", "", time.Minute))),
				onlyErr(s.Complete(ctx, entry(warm, "T", "", time.Minute))),
				onlyErr(s.Release(ctx, entry(warm, "T", "", 0))),
			} {
				if err != nil {
					t.Fatal(err)
				}
			}
			k, m := prefix+":h:one", prefix+":h:mark"
			steps := []struct {
				what        string
				call        func() error
				trips, cmds int64
			}{
				{"Claim of a free key", func() error { _, err := only(s.Claim(ctx, entry(k, "T", "", time.Minute))); return err }, 1, 1},
				{"Claim of a key held", func() error {
					a, err := only(s.Claim(ctx, entry(k, "X", "", time.Minute)))
					if err == nil && a.Status != driver.StatusInProgress {
						err = fmt.Errorf("status %v, want in-progress", a.Status)
					}
					return err
				}, 2, 2},
				{"Extend", func() error { return onlyErr(s.Extend(ctx, entry(k, "T", "", time.Minute))) }, 1, 1},
				{"Complete", func() error { return onlyErr(s.Complete(ctx, entry(k, "T", "", time.Minute))) }, 1, 1},
				{"Release", func() error { return onlyErr(s.Release(ctx, entry(k, "T", "", 0))) }, 1, 1},
				{"Mark", func() error { _, err := only(s.Mark(ctx, entry(m, "T", "", time.Minute))); return err }, 1, 1},
			}
			for _, st := range steps {
				tc.Reset()
				if err := st.call(); err != nil {
					t.Fatalf("%s: %v", st.what, err)
				}
				testenv.ExpectTrips(t, st.what, tc, st.trips, st.cmds)
			}

			const n = 3
			entries := make([]driver.Entry, n)
			for i := range entries {
				entries[i] = driver.Entry{Key: fmt.Sprintf("%s:h:%d", prefix, i), Token: "T", TTL: time.Minute}
			}
			if _, err := s.Claim(ctx, entries[:2]); err != nil { // the third is absent
				t.Fatal(err)
			}
			tc.Reset()
			errs, err := s.Extend(ctx, entries)
			if err != nil || len(errs) != n || errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], driver.ErrLeaseLost) {
				t.Fatalf("Extend: %v %v", errs, err)
			}
			testenv.ExpectTrips(t, "Extend of several", tc, 1, n)
			tc.Reset()
			errs, err = s.Release(ctx, entries)
			if err != nil || len(errs) != n || errs[0] != nil || errs[1] != nil || errs[2] != nil {
				t.Fatalf("Release: %v %v", errs, err)
			}
			testenv.ExpectTrips(t, "Release of several", tc, 1, n)
			if got, err := s.c.Exists(ctx, entries[0].Key, entries[1].Key).Result(); err != nil || got != 0 {
				t.Fatalf("%d records left after Release (%v)", got, err)
			}
		})
	}
}

// In a batch of one, as in a batch of several, an error reply fails the entry (its
// Answer.Err or its slot), and a failed round trip the call, with no answers.
func TestBatchOfOneFailuresAreWhereABatchPutsThem(t *testing.T) {
	m, c := testenv.Miniredis(t)
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	list := testenv.Prefix() + ":h:list"
	if _, err := m.Lpush(list, "x"); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 2} {
		entries := make([]driver.Entry, n)
		for i := range entries {
			entries[i] = driver.Entry{Key: list, Token: "T", TTL: time.Minute}
		}
		for what, call := range map[string]func() ([]error, error){
			"claim":    func() ([]error, error) { as, err := s.Claim(ctx, entries); return answerErrs(as), err },
			"mark":     func() ([]error, error) { as, err := s.Mark(ctx, entries); return answerErrs(as), err },
			"complete": func() ([]error, error) { return s.Complete(ctx, withReply(entries)) },
			"extend":   func() ([]error, error) { return s.Extend(ctx, entries) },
		} {
			errs, err := call()
			if err != nil || len(errs) != n {
				t.Fatalf("%s of %d on a list: %v, call error %v; want the entries' errors", what, n, errs, err)
			}
			for _, e := range errs {
				if !errors.Is(e, driver.ErrStoreUnavailable) || !strings.Contains(e.Error(), "WRONGTYPE") {
					t.Fatalf("%s of %d on a list: entry error %v, want WRONGTYPE", what, n, e)
				}
			}
		}
	}

	down := redis.NewClient(&redis.Options{Addr: testenv.RefusedAddr(t), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { down.Close() })
	s, err = New(down)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 2} {
		entries := make([]driver.Entry, n)
		for i := range entries {
			entries[i] = driver.Entry{Key: fmt.Sprintf("p:h:%d", i), Token: "T", TTL: time.Minute}
		}
		for what, call := range map[string]func() (int, error){
			"claim":    func() (int, error) { as, err := s.Claim(ctx, entries); return len(as), err },
			"mark":     func() (int, error) { as, err := s.Mark(ctx, entries); return len(as), err },
			"complete": func() (int, error) { es, err := s.Complete(ctx, entries); return len(es), err },
			"extend":   func() (int, error) { es, err := s.Extend(ctx, entries); return len(es), err },
			"release":  func() (int, error) { es, err := s.Release(ctx, entries); return len(es), err },
		} {
			if got, err := call(); got != 0 || !errors.Is(err, driver.ErrStoreUnavailable) {
				t.Fatalf("%s of %d, server down: %d answers, call error %v; want none and a store error", what, n, got, err)
			}
		}
	}
}

func answerErrs(as []driver.Answer) []error {
	if as == nil {
		return nil
	}
	errs := make([]error, len(as))
	for i, a := range as {
		errs[i] = a.Err
	}
	return errs
}

// completeWithoutReplies completes entries, none with a reply: a SET PX of DONE per
// key, no script, in one round trip, each answered nil.
func completeWithoutReplies(t *testing.T, s *Store, tc *testenv.TripCounter, entries []driver.Entry) {
	t.Helper()
	tc.Reset()
	errs, err := s.Complete(context.Background(), entries)
	if err != nil {
		t.Fatal(err)
	}
	testenv.ExpectTrips(t, "CompleteMany without replies", tc, 1, int64(len(entries)))
	for i, e := range errs {
		if e != nil {
			t.Fatalf("complete %d without a reply: %v", i, e)
		}
	}
}

// withReply is entries, each with a reply to store: a completion the script checks.
func withReply(entries []driver.Entry) []driver.Entry {
	out := make([]driver.Entry, len(entries))
	for i, e := range entries {
		e.Reply, e.HasReply = "r", true
		out[i] = e
	}
	return out
}

// Claims that keep finding records go straight to the claim script: one round trip
// for a duplicate where SET NX first costs two. Once free keys are the rule again, a
// claim is SET NX first. The answers are the same either way, alone or in a batch.
func TestClaimsThatKeepFindingRecordsGoStraightToTheScript(t *testing.T) {
	for name, mk := range countedRedis(t) {
		t.Run(name, func(t *testing.T) {
			s, tc, prefix := mk(t)
			ctx := context.Background()
			key := func(what string, i int) string { return fmt.Sprintf("%s:h:%s%d", prefix, what, i) }
			const n = 2 * foundMax
			// warm the scripts and the batch probe: a key held, then free ones, which
			// leave found at 0
			for i, tok := range []string{"T", "X", "X"} {
				if _, err := only(s.Claim(ctx, entry(key("warm", i/2), tok, "", time.Minute))); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.Claim(ctx, append(entry(key("warm", 0), "X", "", time.Minute), entry(key("warm", 2), "T", "", time.Minute)...)); err != nil {
				t.Fatal(err)
			}
			for i := range n {
				if _, err := only(s.Mark(ctx, entry(key("done", i), "T", "", time.Minute))); err != nil {
					t.Fatal(err)
				}
			}
			claim := func(k string, want driver.Status) []string {
				t.Helper()
				tc.Reset()
				a, err := only(s.Claim(ctx, entry(k, "X", "", time.Minute)))
				if err != nil || a.Err != nil || a.Status != want {
					t.Fatalf("claim of %s: %v %v %v, want %v", k, a.Status, err, a.Err, want)
				}
				return strings.Split(tc.String(), ", ")
			}
			for i := range n { // duplicates: SET NX then the script, until they are the rule
				got := claim(key("done", i), driver.StatusDuplicate)
				wantCmds := 2
				if i >= foundMax/2 {
					wantCmds = 1
				}
				if len(got) != wantCmds || !strings.HasPrefix(got[len(got)-1], "evalsha") {
					t.Fatalf("duplicate %d sent %v, want %d commands ending with the claim script", i, got, wantCmds)
				}
			}
			for i := range n { // free keys: the script until SET NX is the rule again
				got := claim(key("free", i), driver.StatusAcquired)
				wantFirst := "set"
				if i <= foundMax/2 { // from foundMax down to foundMax/2
					wantFirst = "evalsha"
				}
				if len(got) != 1 || !strings.HasPrefix(got[0], wantFirst) {
					t.Fatalf("free key %d sent %v, want one %s", i, got, wantFirst)
				}
			}
			// a batch of duplicates moves it too: the next batch is one claim_many call
			batch := make([]driver.Entry, n)
			for i := range batch {
				batch[i] = driver.Entry{Key: key("done", i), Token: "Y", TTL: time.Minute}
			}
			for round, trips := range []int64{2, 1} {
				tc.Reset()
				answers, err := s.Claim(ctx, batch)
				if err != nil {
					t.Fatal(err)
				}
				for i, a := range answers {
					if a.Err != nil || a.Status != driver.StatusDuplicate {
						t.Fatalf("round %d, entry %d: %v %v", round, i, a.Status, a.Err)
					}
				}
				if tc.Trips() != trips {
					t.Fatalf("round %d of a batch of duplicates: %d round trips (%s), want %d", round, tc.Trips(), tc, trips)
				}
			}
		})
	}
}

// A Mark of a free key is one SET NX PX, with no GET: Redis does one lookup, and the
// OK reply spares go-redis its nil-reply path. A key that holds a record goes again,
// as SET NX PX GET, which answers as one command would have. Once marks keep finding
// records, SET NX PX GET goes first: one round trip for a duplicate. Alone or in a
// batch, the answers are the same either way.
func TestMarksOfKeysThatHoldARecordGoAgainWithGet(t *testing.T) {
	for name, mk := range countedRedis(t) {
		t.Run(name, func(t *testing.T) {
			s, tc, prefix := mk(t)
			ctx := context.Background()
			key := func(what string) string { return prefix + ":h:" + what }
			if _, err := only(s.Claim(ctx, entry(key("held"), "X", "", time.Minute))); err != nil {
				t.Fatal(err)
			}
			if _, err := only(s.Mark(ctx, entry(key("done"), "X", "f", time.Minute))); err != nil {
				t.Fatal(err)
			}
			mark := func(k, tok, fp string, want driver.Status, trips int64) {
				t.Helper()
				tc.Reset()
				a, err := only(s.Mark(ctx, entry(k, tok, fp, time.Minute)))
				if err != nil || a.Err != nil || a.Status != want {
					t.Fatalf("mark of %s by %s: %v %v %v, want %v", k, tok, a.Status, err, a.Err, want)
				}
				testenv.ExpectTrips(t, "mark of "+k, tc, trips, trips)
				if got := tc.String(); trips == 2 && got != "set×1, set×1" {
					t.Fatalf("mark of %s sent %s, want two SETs", k, got)
				}
			}
			s.found.Store(0)
			mark(key("free"), "T", "", driver.StatusAcquired, 1)
			mark(key("done"), "T", "f", driver.StatusDuplicate, 2)
			mark(key("done"), "T", "g", driver.StatusConflict, 2)
			mark(key("held"), "T", "", driver.StatusInProgress, 2)
			if s.findsRecords() {
				t.Fatal("three marks found records, and marks already go with GET first")
			}
			mark(key("done"), "T", "f", driver.StatusDuplicate, 2)
			if !s.findsRecords() {
				t.Fatal("four marks found records, and marks still go without GET first")
			}
			mark(key("done"), "T", "f", driver.StatusDuplicate, 1)
			mark(key("done"), "X", "f", driver.StatusAcquired, 1) // our own mark, retried
			mark(key("free2"), "T", "", driver.StatusAcquired, 1)
			s.found.Store(0)
			mark(key("done"), "X", "f", driver.StatusAcquired, 2)
			for get, found := range map[bool]int32{false: 0, true: foundMax} {
				s.found.Store(found)
				batch := []driver.Entry{
					{Key: key(fmt.Sprint("new-", get)), Token: "T", TTL: time.Minute},
					{Key: key("done"), Token: "T", Fingerprint: "f", TTL: time.Minute},
					{Key: key("held"), Token: "T", TTL: time.Minute},
					{Key: key("done"), Token: "T", Fingerprint: "g", TTL: time.Minute},
				}
				tc.Reset()
				got, err := s.Mark(ctx, batch)
				if err != nil {
					t.Fatal(err)
				}
				trips, cmds := int64(2), int64(len(batch)+3)
				if get {
					trips, cmds = 1, int64(len(batch))
				}
				testenv.ExpectTrips(t, fmt.Sprintf("batch, GET first %v", get), tc, trips, cmds)
				for i, want := range []driver.Status{driver.StatusAcquired, driver.StatusDuplicate, driver.StatusInProgress, driver.StatusConflict} {
					if got[i].Err != nil || got[i].Status != want {
						t.Fatalf("batch, GET first %v, entry %d: %v %v, want %v", get, i, got[i].Status, got[i].Err, want)
					}
				}
			}
		})
	}
}
