package dedup

import (
	"context"
	"errors"
	"fmt"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/keys"
)

// records returns the store's RecordStore (through the metered wrapper when metrics
// are on), or an error wrapping errors.ErrUnsupported.
func (d *Deduper) records() (driver.RecordStore, error) {
	if _, ok := d.base.(driver.RecordStore); !ok {
		return nil, fmt.Errorf("%w: the store (%T) cannot look up, forget or count records (it does not implement dedup.RecordStore)", errors.ErrUnsupported, d.base)
	}
	return d.store.(driver.RecordStore), nil
}

// RecordInfo is what Lookup and Forget report for one message key.
type RecordInfo struct {
	// Handler is the name the record is under: the handler's own, or one of its
	// former names (WithFormerNames) when that record decides, as it does for Do.
	Handler string
	// RecordKey is the store key of that record, as Handler.RecordKey builds it.
	RecordKey string
	driver.Record
}

// ForgetOption changes what Forget does.
type ForgetOption func(*forgetConfig)

type forgetConfig struct{ force bool }

// ForgetInProgress makes Forget delete a record IN PROGRESS too. That is dangerous:
// its owner is running the handler right now, and will find its lease lost (its fn's
// context is cancelled at the next heartbeat, its completion refused, its message
// neither completed nor acked), while the key is free for another copy to run at
// the same time. Use it only for a claim whose owner is known to be gone and whose
// lease you cannot wait out.
func ForgetInProgress() ForgetOption {
	return func(c *forgetConfig) { c.force = true }
}

// Lookup reports the record of key: its state, owner token, remaining life,
// fingerprint and stored reply size, as the handler would find it, the handler's
// former names included (WithFormerNames): its own record when there is one, else
// a former name's DONE record, else a former name's record IN PROGRESS, else
// RecordAbsent. It costs one round trip and writes nothing. key is the message key as
// the application passes it; Lookup normalizes it as Do does.
//
// An empty key is an error wrapping ErrInvalidOption (messages without a key have no
// record); a store without RecordStore, one wrapping errors.ErrUnsupported; a closed
// Deduper, ErrClosed; a store failure wraps ErrStoreUnavailable (ErrBadRecord for a
// value dedup did not write).
func (h *Handler) Lookup(ctx context.Context, key string) (RecordInfo, error) {
	if err := h.checkInput(ctx, false); err != nil {
		return RecordInfo{}, err
	}
	infos, err := h.LookupMany(ctx, []string{key})
	if err != nil {
		return RecordInfo{}, err
	}
	return infos[0], infos[0].Err
}

// LookupMany is Lookup for several keys in one round trip; the answers are in key
// order, and an item that failed on its own has its Err set. The error is for the
// call as a whole (as Lookup's).
func (h *Handler) LookupMany(ctx context.Context, keys []string) ([]RecordInfo, error) {
	if err := h.checkInput(ctx, false); err != nil {
		return nil, err
	}
	rs, err := h.d.records()
	if err != nil {
		return nil, err
	}
	ks, err := normalizeAll(keys)
	if err != nil {
		return nil, err
	}
	if !h.d.enter() {
		return nil, ErrClosed
	}
	defer h.d.running.Done()
	names := h.names()
	recs, err := rs.Lookup(ctx, h.recordKeys(ks))
	if err != nil {
		return nil, err
	}
	out := make([]RecordInfo, len(ks))
	for i := range ks {
		row := recs[i*len(names) : (i+1)*len(names)]
		j := decide(row)
		out[i] = RecordInfo{Handler: names[j], RecordKey: h.d.cfg.prefix + ":" + names[j] + ":" + ks[i], Record: row[j]}
	}
	return out, nil
}

// Forget deletes the record of key so that the message runs again when it comes,
// under the handler's name and under each of its former names, and tells every
// Deduper that runs the handler on the same store to drop key from its local tier:
// this one at once, the others through the store's forget notices (see
// WithForgetBound for how soon). It returns the record as Lookup would have reported
// it just before; RecordAbsent is not an error (local tiers are told all the same,
// which is what a record deleted by hand needs).
//
// A record IN PROGRESS is left alone unless ForgetInProgress is given: the error then
// wraps ErrRecordInProgress, and the RecordInfo is that record. Each name's record is
// forgotten on its own, so with former names a DONE record under one name is deleted
// even when another name's is left IN PROGRESS. Errors are as Lookup's. A
// transactional handler's database marker (docs/design.md §9) is not touched: it still
// answers Duplicate.
func (h *Handler) Forget(ctx context.Context, key string, opts ...ForgetOption) (RecordInfo, error) {
	if err := h.checkInput(ctx, false); err != nil {
		return RecordInfo{}, err
	}
	var cfg forgetConfig
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	rs, err := h.d.records()
	if err != nil {
		return RecordInfo{}, err
	}
	ks, err := normalizeAll([]string{key})
	if err != nil {
		return RecordInfo{}, err
	}
	if !h.d.enter() {
		return RecordInfo{}, ErrClosed
	}
	defer h.d.running.Done()
	k, names := ks[0], h.names()
	recs, err := rs.Forget(ctx, h.recordKeys(ks), cfg.force)
	if err != nil {
		return RecordInfo{}, err
	}
	j, refused := decide(recs), error(nil)
	for i, r := range recs {
		if r.Err == nil {
			// this process at once; the store's notice tells the others, and this one
			// again, maybe after Forget returned: a key cached again meanwhile is
			// dropped once more (the next call asks the store, which still answers)
			h.d.forgetLocal(names[i], k)
		} else if refused == nil {
			j, refused = i, r.Err // a refusal decides: the caller must see what was left
		}
	}
	info := RecordInfo{Handler: names[j], RecordKey: h.d.cfg.prefix + ":" + names[j] + ":" + k, Record: recs[j]}
	info.Notified = recs[0].Notified
	if refused == nil {
		h.log.Info("dedup: record forgotten", "key_hash", keyHash(k), "state", info.State.String(), "notified", info.Notified)
	}
	return info, refused
}

// CountRecords counts the records under the Deduper's prefix by handler name: every
// handler's, registered here or not (an empty handler), or only handler's. It walks
// the store's whole key space in bounded steps (SCAN with COUNT, never KEYS), so it
// is for operators, not for a hot path. A store without RecordStore is an error
// wrapping errors.ErrUnsupported; a bad handler name wraps ErrInvalidOption.
func (d *Deduper) CountRecords(ctx context.Context, handler string) (map[string]int64, error) {
	if d == nil || d.handlers == nil || ctx == nil {
		return nil, fmt.Errorf("%w: nil *Deduper or context", ErrInvalidOption)
	}
	rs, err := d.records()
	if err != nil {
		return nil, err
	}
	if handler != "" {
		if err := validName(handler); err != nil {
			return nil, err
		}
	}
	return rs.CountRecords(ctx, d.cfg.prefix, handler)
}

// names returns the handler's name, then its former names.
func (h *Handler) names() []string {
	return append([]string{h.name}, h.cfg.formerNames...)
}

// recordKeys returns, for each normalized key, its record keys under names(), in
// that order.
func (h *Handler) recordKeys(ks []string) []string {
	names := h.names()
	out := make([]string, 0, len(ks)*len(names))
	for _, k := range ks {
		for _, n := range names {
			out = append(out, h.d.cfg.prefix+":"+n+":"+k)
		}
	}
	return out
}

// decide picks the record that answers for one message key among its records under
// the handler's names (its own first): its own when present, else the first DONE one,
// else the first IN PROGRESS one, else its own (absent). An item that failed decides
// when nothing else is found, so that its error is not taken for an absence.
func decide(row []driver.Record) int {
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

func normalizeAll(raw []string) ([]string, error) {
	out := make([]string, len(raw))
	for i, key := range raw {
		if key == "" {
			return nil, fmt.Errorf("%w: empty key: a message without a key has no record", ErrInvalidOption)
		}
		out[i] = keys.Normalize(key)
	}
	return out, nil
}
