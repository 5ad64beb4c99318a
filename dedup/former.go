package dedup

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/internal/storekit"
	"github.com/dedupkit/dedupkit/keys"
)

// WithFormerNames lists the names the handler had before a rename (docs/design.md §11).
// Handler names are part of every record key, so without it a renamed handler runs
// again every message still in retention under its old name. With it:
//
//   - New records are written under the handler's own name only.
//   - When a key is new under the own name (a claim acquired, or a Mark's first
//     sighting), the former names' records are read, all in one more round trip (a
//     pipeline of lookup scripts): a DONE record there answers Duplicate (KeyReuse
//     if its fingerprint differs), one IN PROGRESS answers InProgress for what is
//     left of its lease (an instance still running the old name has the message in
//     hand). Each miss costs that round trip; keys found under the own name, and
//     local-tier hits, cost nothing more.
//   - A claim that a former name's record answers is given back before the call
//     returns (one more round trip, for such keys only): a DONE record with the same
//     fingerprint is copied forward (the claim is completed with what is left of the
//     former record's life), so that its next duplicates are found under the own
//     name; otherwise the claim is released.
//   - A Mark has written DONE under the own name before it can look: a former DONE
//     record then makes it answer Duplicate, and its DONE record stays, as the copy
//     forward, with the handler's retention counted from now. That record is true:
//     the message did run, under the former name. A former record IN PROGRESS makes
//     it answer InProgress (a filter drops it) and the DONE record stays too, so if
//     that run fails, its redelivery is dropped as a filter drops a failed run. Should
//     the lookup fail, the Mark answers First (it runs) rather than drop a message on
//     account of a rename.
//   - A former DONE record's stored reply (WithReplies) answers the reply forms'
//     duplicates, and is copied forward with the record.
//   - Lookup, LookupMany and Forget cover the former names' records too.
//
// Each name is validated as a handler name. Register refuses, wrapping
// ErrInvalidOption, a former name that is the handler's own name, the name or a
// former name of a handler registered before or after, a name given twice, and a
// store that does not implement RecordStore. Default: none. Drop a former name once
// its records have expired (the retention after the rename).
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

// checkFormerNames refuses former names that are h's own name, or that another
// registered handler has as its name or a former name. Called under d.mu.
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

// formerStore is the store as a handler with former names sees it: Claim, Mark,
// ClaimMany and MarkMany answer for the former names' records too. It is the one
// place the former names are checked; every path (Do, Mark, Handle, the batches, the
// transactional runs) reaches the store through it.
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

// settle reads, in one round trip, the former names' records of the entries the
// store answered Acquired (claims, or marks), and changes those answers to what a
// former record says; see WithFormerNames. Claims answered so are given back
// (giveBack) before it returns.
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

// giveBack completes (copies forward) the claims with a TTL, in one round trip, and
// releases the others, side by side (so that auto-pipelining sends them together).
// It waits for them: until then the key would answer InProgress for a whole lease
// to a copy checked elsewhere, instead of Duplicate. That costs the caller a round
// trip on a key found under a former name (a duplicate), never on a new key.
func (s *formerStore) giveBack(ctx context.Context, claims []driver.Entry) {
	h := s.h
	bg, done := h.settleCtx(ctx, min(h.cfg.lease, releaseTimeout))
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
