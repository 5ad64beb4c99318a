package dedup

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/internal/batcher"
	"github.com/dedupkit/dedupkit/internal/storekit"
	"github.com/dedupkit/dedupkit/keys"
)

// WithFormerNames lists the names the handler had before a rename, so that their
// records still count (docs/design.md §11): a key new under the handler's name is
// looked up under the former names in one more round trip, and a DONE record there
// answers Duplicate (and is copied forward), one IN PROGRESS as such a record does. New
// records are written under the current name only; Lookup and Forget cover the
// former names too. Default: none. Register refuses, wrapping ErrInvalidOption, an
// invalid or repeated name, the handler's own name, a name or former name of another
// handler, and a store that does not implement RecordStore. Drop a former name once
// a retention has passed since the rename. See docs/operating.md.
func WithFormerNames(names ...string) HandlerOption {
	return func(c *handlerConfig) error {
		for i, n := range names {
			if err := keys.ValidateName(n); err != nil {
				return fmt.Errorf("%w: former name: %w", ErrInvalidOption, err)
			}
			if slices.Contains(names[:i], n) {
				return fmt.Errorf("%w: former name %q is given twice", ErrInvalidOption, n)
			}
		}
		c.formerNames = slices.Clone(names)
		return nil
	}
}

// checkFormerNames refuses names h shares with itself or another handler; d.mu held.
func (d *Deduper) checkFormerNames(h *Handler) error {
	for _, n := range h.cfg.formerNames {
		if n == h.name {
			return fmt.Errorf("%w: handler %q: former name %q is its own name", ErrInvalidOption, h.name, n)
		}
	}
	for _, o := range d.handlers {
		if slices.Contains(o.cfg.formerNames, h.name) {
			return fmt.Errorf("%w: handler %q: it is a former name of handler %q", ErrInvalidOption, h.name, o.name)
		}
		for _, n := range h.cfg.formerNames {
			if n == o.name || slices.Contains(o.cfg.formerNames, n) {
				return fmt.Errorf("%w: handler %q: former name %q is a name of handler %q", ErrInvalidOption, h.name, n, o.name)
			}
		}
	}
	return nil
}

// formerStore is the store as a handler with former names sees it: Claim and Mark
// answer for the former names' records too. Every path reaches the store through it.
type formerStore struct {
	driver.Store
	h       *Handler
	records driver.RecordStore
}

// Claim implements Store.
func (s *formerStore) Claim(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	as, err := s.Store.Claim(ctx, entries)
	if err == nil {
		s.settle(ctx, entries, as, true)
	}
	return as, err
}

// Mark implements Store.
func (s *formerStore) Mark(ctx context.Context, entries []driver.Entry) ([]driver.Answer, error) {
	as, err := s.Store.Mark(ctx, entries)
	if err == nil {
		s.settle(ctx, entries, as, false)
	}
	return as, err
}

// settle looks up, in one round trip, the former names' records of the entries
// answered Acquired and answers as they say; claims so answered are given back.
func (s *formerStore) settle(ctx context.Context, entries []driver.Entry, answers []driver.Answer, claims bool) {
	h := s.h
	var acquired []int
	for i, a := range answers {
		if a.Err == nil && a.Status == driver.StatusAcquired {
			acquired = append(acquired, i)
		}
	}
	if len(acquired) == 0 {
		return
	}
	formers := len(h.formerHeads)
	keys := make([]string, 0, len(acquired)*formers)
	for _, i := range acquired {
		k := entries[i].Key[len(h.keyHead):]
		for _, head := range h.formerHeads {
			keys = append(keys, head+k)
		}
	}
	recs, err := s.records.Lookup(ctx, keys)
	var undo []driver.Entry // claims to give back: TTL > 0 copies the record forward
	for j, i := range acquired {
		e := entries[i]
		var r driver.Record
		rerr := err
		if rerr == nil {
			r, rerr = formerRecord(recs[j*formers : (j+1)*formers])
		}
		if rerr != nil {
			if claims { // the caller gives the claim back, as for any failed claim
				answers[i] = driver.Answer{Err: storekit.StoreErr("claim: former names", rerr)}
			} else {
				h.log.Warn("dedup: former names could not be read; the mark's first sighting stands", "key_hash", keyHash(e.Key[len(h.keyHead):]), "err", rerr)
			}
			continue
		}
		switch {
		case r.State == driver.RecordDone && storekit.FingerprintsDiffer(r.Fingerprint, e.Fingerprint):
			answers[i] = driver.Answer{Status: driver.StatusConflict}
		case r.State == driver.RecordDone:
			answers[i] = driver.Answer{Status: driver.StatusDuplicate, TTL: r.TTL, Reply: r.Reply, HasReply: r.HasReply}
		case r.State == driver.RecordInProgress:
			answers[i] = driver.Answer{Status: driver.StatusInProgress, TTL: r.TTL}
		default:
			continue
		}
		h.log.Debug("dedup: key found under a former name", "key_hash", keyHash(e.Key[len(h.keyHead):]), "state", r.State.String())
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

// giveBack copies forward (completes) the claims with a TTL and releases the others,
// side by side. It waits for them: meanwhile the key would answer InProgress for a
// whole lease to copies checked elsewhere, instead of Duplicate.
func (s *formerStore) giveBack(ctx context.Context, claims []driver.Entry) {
	h := s.h
	bg, done := batcher.Settle(ctx, min(h.cfg.lease, batcher.ReleaseTimeout))
	defer done()
	var wg sync.WaitGroup
	release := func(e driver.Entry) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.release(bg, e.Key[len(h.keyHead):], e.Key, e.Token)
		}()
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
				h.log.Debug("dedup: copying a former name's record forward failed", "key_hash", keyHash(e.Key[len(h.keyHead):]), "err", ferr)
				release(e)
			}
		}
	}
	wg.Wait()
}

// formerRecord picks what a key's records under the former names say: the first
// DONE one, else the first IN PROGRESS one, else none (absent). A record that could
// not be read is an error unless a DONE one decides anyway.
func formerRecord(row []driver.Record) (driver.Record, error) {
	if j := decide(append([]driver.Record{{}}, row...)); j > 0 {
		return row[j-1], row[j-1].Err
	}
	return driver.Record{}, nil
}
