package dedup

import (
	"context"
	"errors"
	"fmt"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/internal/former"
	"github.com/dedupkit/dedupkit/keys"
)

// records returns d.store as a RecordStore, or an error wrapping errors.ErrUnsupported.
func (d *Deduper) records() (driver.RecordStore, error) {
	if _, ok := d.base.(driver.RecordStore); !ok {
		return nil, fmt.Errorf("%w: the store (%T) cannot look up, forget or count records (it does not implement dedup.RecordStore)", errors.ErrUnsupported, d.base)
	}
	return d.store.(driver.RecordStore), nil
}

// RecordInfo is what Lookup and Forget report for one message key.
type RecordInfo struct {
	Handler   string // the name the record is under: the handler's or a former name
	RecordKey string // the record's store key
	driver.Record
}

// ForgetOption changes what Forget does.
type ForgetOption func(*forgetConfig)

type forgetConfig struct{ force bool }

// ForgetInProgress makes Forget delete a record IN PROGRESS too. Its owner then loses
// its lease while another copy may run: use it only for an owner known to be gone.
func ForgetInProgress() ForgetOption { return func(c *forgetConfig) { c.force = true } }

// Lookup reports the record of key as Do would find it, former names included, in
// one round trip, writing nothing. Errors wrap ErrInvalidOption for an empty key,
// errors.ErrUnsupported for a store without driver.RecordStore, or ErrStoreUnavailable.
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

// LookupMany is Lookup for several keys in one round trip, answered in key order. An
// item that failed on its own has its Err set; the error is for the whole call.
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
		j := former.Decide(row)
		out[i] = RecordInfo{Handler: names[j], RecordKey: h.d.cfg.prefix + ":" + names[j] + ":" + ks[i], Record: row[j]}
		out[i].Reply = "" // never shown to operators: its size only
	}
	return out, nil
}

// Forget deletes the record of key, under the handler's name and former names, so the
// message runs again, and drops key from the local tier of every Deduper running the
// handler (see WithForgetBound). It returns the record as it was; an absent one is no
// error. A record IN PROGRESS is kept, with an error wrapping ErrRecordInProgress,
// unless ForgetInProgress is given. Other errors are Lookup's. A transactional marker
// is not touched.
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
	j, refused := former.Decide(recs), error(nil)
	for i, r := range recs {
		if r.Err == nil {
			// this process at once; the store's notice tells the others
			h.d.forgetLocal(names[i], k)
		} else if refused == nil {
			j, refused = i, r.Err // the caller must see what was left
		}
	}
	info := RecordInfo{Handler: names[j], RecordKey: h.d.cfg.prefix + ":" + names[j] + ":" + k, Record: recs[j]}
	info.Notified, info.Reply = recs[0].Notified, "" // the reply's size only
	if refused == nil {
		h.log.Info("dedup: record forgotten", "key_hash", keyHash(k), "state", info.State.String(), "notified", info.Notified)
	}
	return info, refused
}

// CountRecords counts the records under the prefix by handler name, for every handler
// ("") or one. It scans the whole key space: for operators, not hot paths. A store
// without driver.RecordStore is an error wrapping errors.ErrUnsupported.
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

func (h *Handler) names() []string { return append([]string{h.name}, h.cfg.formerNames...) }

// recordKeys returns each key's record keys under names(), in that order.
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
