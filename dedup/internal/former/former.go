// Package former is the store as a handler with former names sees it
// (dedup.WithFormerNames, docs/design.md §11): Claim and Mark answer for the former
// names' records too.
package former

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/internal/batcher"
	"github.com/dedupkit/dedupkit/internal/storekit"
)

// Store answers a key new under the handler's name (Head) from its records under
// the former names (Formers), looked up in one more round trip: a DONE record there
// answers Duplicate and is copied forward, one IN PROGRESS answers as such a record
// does. Every path of the handler reaches the store through it.
type Store struct {
	driver.Store
	Records driver.RecordStore
	// Head is "<prefix>:<name>:"; Formers the same for each former name.
	Head    string
	Formers []string
	Log     *slog.Logger
	// Wait bounds giving back the claims a former record answered.
	Wait time.Duration
}

// Claim implements driver.Store.
func (s *Store) Claim(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	as, err := s.Store.Claim(ctx, entries)
	if err == nil {
		s.settle(ctx, entries, as, true)
	}
	return as, err
}

// Mark implements driver.Store.
func (s *Store) Mark(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	as, err := s.Store.Mark(ctx, entries)
	if err == nil {
		s.settle(ctx, entries, as, false)
	}
	return as, err
}

// settle looks up, in one round trip, the former names' records of the entries
// answered Acquired and answers as they say; claims so answered are given back.
func (s *Store) settle(ctx context.Context, entries []driver.Entry, answers []driver.Answer, claims bool) {
	var acquired []int
	for i, a := range answers {
		if a.Err == nil && a.Status == driver.StatusAcquired {
			acquired = append(acquired, i)
		}
	}
	if len(acquired) == 0 {
		return
	}
	formers := len(s.Formers)
	keys := make([]string, 0, len(acquired)*formers)
	for _, i := range acquired {
		k := entries[i].Key[len(s.Head):]
		for _, head := range s.Formers {
			keys = append(keys, head+k)
		}
	}
	recs, err := s.Records.Lookup(ctx, keys)
	var undo []driver.Entry // claims to give back: TTL > 0 copies the record forward
	for j, i := range acquired {
		e := entries[i]
		var r driver.Record
		rerr := err
		if rerr == nil {
			r, rerr = pick(recs[j*formers : (j+1)*formers])
		}
		if rerr != nil {
			if claims { // the caller gives the claim back, as for any failed claim
				answers[i] = driver.Answer{Err: storekit.StoreErr("claim: former names", rerr)}
			} else {
				s.Log.Warn("dedup: former names could not be read; the mark's first sighting stands", "key_hash", s.hash(e), "err", rerr)
			}
			continue
		}
		a, found := answerOf(r, e)
		if !found {
			continue
		}
		answers[i] = a
		s.Log.Debug("dedup: key found under a former name", "key_hash", s.hash(e), "state", r.State.String())
		if claims {
			e.TTL = 0
			if r.State == driver.RecordDone && r.Fingerprint == e.Fingerprint && r.TTL > 0 {
				e.TTL = r.TTL
				e.Reply, e.HasReply = r.Reply, r.HasReply // copied forward with its reply
			}
			undo = append(undo, e)
		}
	}
	if len(undo) > 0 {
		s.giveBack(ctx, undo)
	}
}

// answerOf is what r, e's record under a former name, answers; found is false when
// it is absent.
func answerOf(r driver.Record, e driver.Entry) (a driver.Answer, found bool) {
	switch {
	case r.State == driver.RecordDone && storekit.FingerprintsDiffer(r.Fingerprint, e.Fingerprint):
		return driver.Answer{Status: driver.StatusConflict}, true
	case r.State == driver.RecordDone:
		return driver.Answer{Status: driver.StatusDuplicate, TTL: r.TTL, Reply: r.Reply, HasReply: r.HasReply}, true
	case r.State == driver.RecordInProgress:
		return driver.Answer{Status: driver.StatusInProgress, TTL: r.TTL}, true
	}
	return driver.Answer{Status: driver.StatusAcquired}, false
}

// Look answers entries from their records under the former names alone, in one round
// trip, claiming nothing (a transactional run's check: its marker guards the rest):
// as those records say, or Acquired where none is.
func (s *Store) Look(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	n := len(s.Formers)
	keys := make([]string, 0, len(entries)*n)
	for _, e := range entries {
		for _, head := range s.Formers {
			keys = append(keys, head+e.Key[len(s.Head):])
		}
	}
	recs, err := s.Records.Lookup(ctx, keys)
	if err == nil && len(recs) != len(keys) {
		err = storekit.StoreErr("look: former names", fmt.Errorf("%d records for %d keys", len(recs), len(keys)))
	}
	if err != nil {
		return nil, err
	}
	as := make([]driver.Answer, len(entries))
	for i, e := range entries {
		r, rerr := pick(recs[i*n : (i+1)*n])
		if rerr != nil {
			as[i].Err = storekit.StoreErr("look: former names", rerr)
			continue
		}
		as[i], _ = answerOf(r, e)
	}
	return as, nil
}

func (s *Store) hash(e driver.Entry) string { return storekit.KeyHash(e.Key[len(s.Head):]) }

// giveBack copies forward (completes) the claims with a TTL and releases the others,
// side by side. It waits for them: meanwhile the key would answer InProgress for a
// whole lease to copies checked elsewhere, instead of Duplicate.
func (s *Store) giveBack(ctx context.Context, claims []driver.Entry) {
	bg, done := batcher.Settle(ctx, s.Wait)
	defer done()
	var wg sync.WaitGroup
	release := func(e driver.Entry) {
		wg.Go(func() {
			if err := storekit.OnlyErr(s.Store.Release(bg, []driver.Entry{e})); err != nil {
				s.Log.Warn("dedup: release failed; the claim, if it landed, stays until its lease ends", "key_hash", s.hash(e), "err", err)
			}
		})
	}
	var forward []driver.Entry
	for _, e := range claims {
		if e.TTL > 0 {
			forward = append(forward, e)
		} else {
			release(e)
		}
	}
	if len(forward) > 0 {
		errs, err := s.Store.Complete(bg, forward)
		for j, e := range forward {
			ferr := err
			if ferr == nil {
				ferr = errs[j]
			}
			if ferr != nil { // released instead: the former record still answers
				s.Log.Debug("dedup: copying a former name's record forward failed", "key_hash", s.hash(e), "err", ferr)
				release(e)
			}
		}
	}
	wg.Wait()
}

// pick picks what a key's records under the former names say: the first DONE one,
// else the first IN PROGRESS one, else none (absent). A record that could not be
// read is an error unless a DONE one decides anyway.
func pick(row []driver.Record) (driver.Record, error) {
	if j := Decide(append([]driver.Record{{}}, row...)); j > 0 {
		return row[j-1], row[j-1].Err
	}
	return driver.Record{}, nil
}

// Decide picks the record that answers among a key's records under a handler's
// names, its own first: its own if present, else the first DONE, else the first IN
// PROGRESS. Failing that, an item that failed decides, so that its error is not
// taken for an absence.
func Decide(row []driver.Record) int {
	if row[0].State != driver.RecordAbsent || row[0].Err != nil {
		return 0
	}
	for _, want := range []driver.RecordState{driver.RecordDone, driver.RecordInProgress} {
		for j, r := range row[1:] {
			if r.Err == nil && r.State == want {
				return j + 1
			}
		}
	}
	for j, r := range row[1:] {
		if r.Err != nil {
			return j + 1
		}
	}
	return 0
}
