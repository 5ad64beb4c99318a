package dedup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/dedup/internal/notices"
	"github.com/dedupkit/dedupkit/internal/storekit"
)

// Forget notices (docs/design.md §11; the subscription is internal/notices): a key
// Forget deletes leaves the local tiers of every Deduper on the store within the
// forget bound.

const defaultForgetBound = 2 * time.Second

const minForgetBound = 40 * time.Millisecond

// WithForgetBound sets how long at most a key forgotten by another process may go on
// answering Duplicate from this Deduper's local tiers when its forget notice is lost
// (default 2s, at least 40ms). A shorter bound costs more PINGs, and local tiers
// emptied more often while Redis is unreachable (docs/operating.md).
func WithForgetBound(d time.Duration) Option {
	return func(c *config) error {
		if d < minForgetBound {
			return fmt.Errorf("%w: forget bound %v is below %v", ErrInvalidOption, d, minForgetBound)
		}
		c.forgetBound = d
		return nil
	}
}

// watchNotices subscribes the Deduper to the channels of h's names (internal/notices).
func (d *Deduper) watchNotices(h *Handler) {
	n, ok := d.base.(storekit.Notifier)
	if !ok || h.local == nil {
		h.listening.Store(true) // nothing to hear
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	if d.notices == nil {
		d.notices = notices.Start(n.ForgetNotices().Subscribe(), d.cfg.forgetBound, d.cfg.logger, d.tiersOn)
	}
	d.notices.Add(noticeTier{h})
}

// stopNotices ends the subscription (a bounded wait).
func (d *Deduper) stopNotices() {
	d.mu.Lock()
	l := d.notices
	d.mu.Unlock()
	if l != nil {
		l.Stop()
	}
}

// noticeTier is a handler's local tier, as the notice listener sees it.
type noticeTier struct{ h *Handler }

func (t noticeTier) Channels() []string {
	cs := make([]string, 0, 1+len(t.h.formerHeads))
	for _, n := range t.h.names() {
		cs = append(cs, t.h.d.cfg.prefix+":"+n)
	}
	return cs
}
func (t noticeTier) Drop(k string)  { t.h.dropLocal(k) }
func (t noticeTier) Purge()         { t.h.purgeLocal() }
func (t noticeTier) Listen(on bool) { t.h.listening.Store(on) }

// tiersOn is onChannel for the listener.
func (d *Deduper) tiersOn(channel string) []notices.Tier {
	hs := d.onChannel(channel)
	ts := make([]notices.Tier, len(hs))
	for i, h := range hs {
		ts[i] = noticeTier{h}
	}
	return ts
}

// onChannel returns the handler with a local tier on the channel <prefix>:<name>
// (by name or former name), or all of them for "".
func (d *Deduper) onChannel(channel string) []*Handler {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if channel == "" {
		var hs []*Handler
		for _, h := range d.handlers {
			if h.local != nil {
				hs = append(hs, h)
			}
		}
		return hs
	}
	name, ok := strings.CutPrefix(channel, d.cfg.prefix+":")
	if h := d.byName[name]; ok && h != nil {
		return []*Handler{h}
	}
	return nil
}

// forgetLocal drops the normalized key k from the local tier of handler name.
func (d *Deduper) forgetLocal(name, k string) {
	for _, h := range d.onChannel(d.cfg.prefix + ":" + name) {
		h.dropLocal(k)
	}
}

// dropLocal drops the normalized key k, under every fingerprint (k#fp), from the
// local tier. The forget is counted first, so that an answer that predates it is not
// cached after it (Handler.stale).
func (h *Handler) dropLocal(k string) {
	if h.local == nil {
		return
	}
	h.forgets.Add(1)
	h.local.Remove(k)
	if h.replies != nil {
		h.replies.Remove(k)
	}
	if h.cfg.fingerprint {
		h.local.RemovePrefix(k + "#")
		if h.replies != nil {
			h.replies.RemovePrefix(k + "#")
		}
	}
	h.log.Debug("dedup: forgotten key dropped from the local tier", "key_hash", keyHash(k))
}

// purgeLocal drops the whole local tier, for notices that may have been lost.
func (h *Handler) purgeLocal() {
	if h.local == nil {
		return
	}
	h.forgets.Add(1)
	h.local.RemovePrefix("")
	if h.replies != nil {
		h.replies.RemovePrefix("")
	}
}

// Subscribers returns how many Dedupers now subscribe to the handler's forget
// notices: those running it with a local tier. A store without notices is an error
// wrapping errors.ErrUnsupported; a store failure wraps ErrStoreUnavailable.
func (h *Handler) Subscribers(ctx context.Context) (int64, error) {
	if err := h.checkInput(ctx, false); err != nil {
		return 0, err
	}
	n, ok := h.d.base.(storekit.Notifier)
	if !ok {
		return 0, fmt.Errorf("%w: the store (%T) carries no forget notices", errors.ErrUnsupported, h.d.base)
	}
	return n.ForgetNotices().Subscribers(ctx, h.d.cfg.prefix+":"+h.name)
}

// noticeHealth is the forget-notice check, when the Deduper has a subscription.
func (d *Deduper) noticeHealth() (driver.HealthCheck, bool) {
	d.mu.RLock()
	l := d.notices
	d.mu.RUnlock()
	if l == nil {
		return driver.HealthCheck{}, false
	}
	if s, bad := l.State(); bad {
		return driver.HealthCheck{Name: driver.CheckForgetNotices, Status: driver.HealthWarn, Detail: s}, true
	}
	return driver.HealthCheck{Name: driver.CheckForgetNotices, Status: driver.HealthOK, Value: "subscribed"}, true
}
