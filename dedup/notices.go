package dedup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/internal/storekit"
)

// Forget notices tell every Deduper that a record was forgotten, so that it drops the
// key from its handlers' local tiers. A record key <prefix>:<handler>:<k> has its
// notices on the channel <prefix>:<handler>, with k as the payload; the store sends
// one for each record Forget deletes (redisstore.Store: from the script that deletes it).
// Each Deduper subscribes to the channels of its handlers that have a local tier
// (their names and former names), on one subscription, on one goroutine that Close
// stops. A notice may be missed: the subscription's connection can break, and what
// is published meanwhile is lost. The goroutine checks every tick (bound/4): it
// PINGs a subscription it has not heard from (a notice, a confirmation, a PONG) for
// half a tick, so a live one is never silent for long; it drops every local tier
// when it has heard nothing for two ticks (and at every check while that lasts); it
// drops the tiers of the handlers whose channels the server has not confirmed (a
// refused or lost subscription); and a channel confirmed again (after a
// reconnection) drops its handlers' tiers at once. A notice lost at time T was
// published on a line last heard from before T, so the next check past two ticks of
// silence, at most T + 3.5 ticks (a PING waits at most half a tick), drops the key:
// within the bound.

// defaultForgetBound is how long a local tier may at most go on answering Duplicate
// for a key forgotten elsewhere, when its notice is lost; see WithForgetBound.
const defaultForgetBound = 2 * time.Second

// minForgetBound is the least bound WithForgetBound accepts.
const minForgetBound = 40 * time.Millisecond

// WithForgetBound sets how long at most a key forgotten by another process (Forget)
// may go on answering Duplicate from this Deduper's local tiers if its forget notice
// is lost (default 2s, at least 40ms). A notice heard drops
// the key at once (about a millisecond after Forget returns, on one host:
// TestForgetReachesEveryProcess). To keep the bound when notices are lost
// (TestMissedForgetNoticesDropTheLocalTiersWithinTheBound), the Deduper PINGs its subscription every bound/4
// while it hears nothing else, drops all its local tiers when it has heard nothing
// for bound/2, and again every bound/4 until it hears again, and drops a handler's
// tier while the subscription to its channel is not confirmed (a Redis ACL user
// needs the channels &<prefix>:* and +subscribe +ping +publish). A shorter bound
// costs more PINGs and, while Redis is unreachable, a local tier emptied more often.
// Only stores that carry notices (redisstore.Store, memstore.Store) are subscribed to, and
// only for handlers with a local tier.
func WithForgetBound(d time.Duration) Option {
	return func(c *config) error {
		if d < minForgetBound {
			return fmt.Errorf("%w: forget bound %v is below %v", ErrInvalidOption, d, minForgetBound)
		}
		c.forgetBound = d
		return nil
	}
}

// noticeListener is a Deduper's subscription to forget notices and its goroutine.
type noticeListener struct {
	d      *Deduper
	sub    storekit.Sub
	tick   time.Duration // bound/4: how often it checks, and how much silence earns a PING
	cancel context.CancelFunc
	done   chan struct{}
	// state is what Health reports: nil while all is well
	state atomic.Pointer[string]
	// warned is when the last warning about lost notices was logged (unix nanos)
	warned atomic.Int64

	adds sync.WaitGroup // subscriptions being sent (watchNotices)
}

// watchNotices subscribes the Deduper to the forget notices of h, its names and former
// names, starting the subscription with the first handler. Called by Register for a
// handler with a local tier, once h is registered and before it is returned. It does
// not wait for the network: the subscription is sent on a goroutine of its own (which
// Close waits for), and until the server confirms it, h's local tier is dropped at
// every check, and once more at the confirmation (notices sent before it may have
// been lost), as it is whenever a channel is confirmed again.
func (d *Deduper) watchNotices(h *Handler) {
	n, ok := d.base.(storekit.Notifier)
	if !ok || h.local == nil {
		h.listening.Store(true) // nothing to hear
		return
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	l := d.notices
	if l == nil {
		ctx, cancel := context.WithCancel(context.Background())
		l = &noticeListener{d: d, sub: n.ForgetNotices().Subscribe(), tick: d.cfg.forgetBound / 4, cancel: cancel, done: make(chan struct{})}
		d.notices = l
		go l.run(ctx)
	}
	channels := make([]string, 0, 1+len(h.cfg.formerNames))
	for _, n := range h.names() {
		channels = append(channels, d.cfg.prefix+":"+n)
	}
	if l.sub.InProcess() {
		// subscribed at once, and no notice can be lost: h may take keys now
		d.mu.Unlock()
		_ = l.sub.Add(context.Background(), channels...)
		h.listening.Store(true)
		return
	}
	l.adds.Add(1)
	d.mu.Unlock()
	go func() {
		defer l.adds.Done()
		ctx, cancel := context.WithTimeout(context.Background(), l.tick)
		defer cancel()
		if err := l.sub.Add(ctx, channels...); err != nil {
			// the subscription is made on the next connection; until it is confirmed,
			// h's local tier is dropped at every check
			d.cfg.logger.Debug("dedup: subscribing to forget notices failed; retrying", "handler", h.name, "err", err)
		}
	}()
}

// stopNotices ends the subscription and waits for its goroutines, for at most
// noticeStopWait: a subscription still being set up holds its connection's lock
// until the client gives up on a server that does not answer, and its goroutines end
// then. Called by Close.
func (d *Deduper) stopNotices() {
	d.mu.Lock()
	l := d.notices
	d.mu.Unlock()
	if l == nil {
		return
	}
	l.cancel()
	stopped := make(chan struct{})
	go func() {
		_ = l.sub.Close() // ends a receive, or a subscription, that waits on the network
		<-l.done
		l.adds.Wait()
		close(stopped)
	}()
	t := time.NewTimer(noticeStopWait)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		d.cfg.logger.Debug("dedup: forget notices' subscription still waiting on the store at Close; it ends when the client gives up")
	}
}

// noticeStopWait bounds Close's wait for the forget notices' subscription.
const noticeStopWait = 250 * time.Millisecond

func (l *noticeListener) run(ctx context.Context) {
	defer close(l.done)
	confirmed := make(map[string]bool) // channels whose subscription the server confirmed
	last := time.Now()                 // when the subscription was last heard from
	next := last.Add(l.tick)           // the next check
	for ctx.Err() == nil {
		// a deadline too, which bounds a redial (go-redis redials within receive)
		wait := max(time.Until(next), time.Millisecond)
		rctx, cancel := context.WithTimeout(ctx, wait+l.tick/2)
		n, err := l.sub.Receive(rctx, wait)
		cancel()
		now := time.Now()
		var refused *storekit.Refused
		switch {
		case err == nil:
			last = now
			l.handle(n, confirmed)
		case errors.Is(err, storekit.ErrNoNotice):
		case ctx.Err() != nil:
			return
		case errors.As(err, &refused): // the server refused a SUBSCRIBE or PING (an ACL)
			l.warn("forget notices refused", refused.Err)
		default: // the connection failed: the next receive dials again and subscribes again
			clear(confirmed)
			for _, h := range l.d.onChannel("") {
				h.listening.Store(false) // until its channels are confirmed again
			}
			l.warn("forget notices' connection failed", err)
			_ = sleepCtx(ctx, time.Until(next))
		}
		if now = time.Now(); now.Before(next) {
			continue
		}
		next = now.Add(l.tick)
		l.check(ctx, now.Sub(last), confirmed)
	}
}

// handle applies one notice.
func (l *noticeListener) handle(n storekit.Notice, confirmed map[string]bool) {
	d := l.d
	switch n.Kind {
	case storekit.Subscribed:
		// notices sent before the server confirmed the channel were lost to it
		confirmed[n.Channel] = true
		for _, h := range d.onChannel(n.Channel) {
			if !n.Lossless {
				h.purgeLocal()
			}
			all := true
			for _, name := range h.names() {
				all = all && confirmed[d.cfg.prefix+":"+name]
			}
			if all {
				h.listening.Store(true) // its notices are heard: it may take keys
			}
		}
	case storekit.Forgotten:
		for _, h := range d.onChannel(n.Channel) {
			h.dropLocal(n.K)
		}
	case storekit.Missed:
		l.warn("forget notices lost", errors.New("the queue of notices overflowed"))
		for _, h := range d.onChannel("") {
			h.purgeLocal()
		}
	}
}

// check runs every tick: a PING after half a tick of silence, every local tier
// dropped after two ticks, and the tiers of the handlers whose channels are not
// confirmed.
func (l *noticeListener) check(ctx context.Context, silent time.Duration, confirmed map[string]bool) {
	d := l.d
	// A PING at every check of a quiet line: its reply comes well before the next
	// check, so a live line is never silent for two ticks.
	if silent >= l.tick/2 {
		pctx, cancel := context.WithTimeout(ctx, l.tick/2)
		_ = l.sub.Ping(pctx) // its reply, or a failure, comes to receive
		cancel()
	}
	if silent >= 2*l.tick {
		for _, h := range d.onChannel("") {
			h.purgeLocal()
		}
		s := fmt.Sprintf("nothing heard from the forget notices' subscription for %v: every local tier is dropped every %v", silent.Round(time.Millisecond), l.tick)
		l.state.Store(&s)
		l.warn("forget notices silent", errors.New(s))
		return
	}
	var unconfirmed []string
	for _, h := range d.onChannel("") {
		for _, n := range h.names() {
			if c := d.cfg.prefix + ":" + n; !confirmed[c] {
				unconfirmed = append(unconfirmed, c)
				h.purgeLocal()
				break
			}
		}
	}
	if len(unconfirmed) == 0 {
		l.state.Store(nil)
		return
	}
	s := fmt.Sprintf("not subscribed to %s: those handlers' local tiers are dropped every %v", strings.Join(unconfirmed, ", "), l.tick)
	l.state.Store(&s)
}

// warn logs a lost or refused subscription at most once a minute (at Debug between).
func (l *noticeListener) warn(msg string, err error) {
	now := time.Now().UnixNano()
	if w := l.warned.Load(); now-w < int64(time.Minute) || !l.warned.CompareAndSwap(w, now) {
		l.d.cfg.logger.Debug("dedup: "+msg, "err", err)
		return
	}
	l.d.cfg.logger.Warn("dedup: "+msg+"; local tiers are dropped until the subscription is back (a Redis ACL user needs &<prefix>:* +subscribe +ping)", "err", err)
}

// onChannel returns the handler with a local tier whose name or former name has the
// channel <prefix>:<name> (names never collide: Register refuses it); all of those
// handlers for "".
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

// forgetLocal drops the normalized key k from the local tier of every handler of
// this Deduper with the name or former name name.
func (d *Deduper) forgetLocal(name, k string) {
	for _, h := range d.onChannel(d.cfg.prefix + ":" + name) {
		h.dropLocal(k)
	}
}

// dropLocal drops the normalized key k from the local tier, with every fingerprint
// (a fingerprinted key is held as k#fingerprint: those are found by a visit of the
// whole tier, see lru.Cache.RemovePrefix). A flight out for k is marked first, so
// that its answer, which may predate the forget, is not cached after (remember).
func (h *Handler) dropLocal(k string) {
	if h.local == nil {
		return
	}
	h.flights.invalidate(k)
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
	h.flights.invalidateAll()
	h.local.RemovePrefix("")
	if h.replies != nil {
		h.replies.RemovePrefix("")
	}
}

// Subscribers returns how many Dedupers subscribe to this handler's forget notices
// right now: the processes that run a handler of this name (or with it as a former
// name) with a local tier, on this store, this one included if it does. On a Redis
// Cluster it sums PUBSUB NUMSUB over the masters. A store that carries no notices is
// an error wrapping errors.ErrUnsupported; a failure wraps ErrStoreUnavailable.
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

// noticeHealth is the Deduper's forget-notice check, when it has a subscription.
func (d *Deduper) noticeHealth() (driver.HealthCheck, bool) {
	d.mu.RLock()
	l := d.notices
	d.mu.RUnlock()
	if l == nil {
		return driver.HealthCheck{}, false
	}
	if s := l.state.Load(); s != nil {
		return driver.HealthCheck{Name: driver.CheckForgetNotices, Status: driver.HealthWarn, Detail: *s}, true
	}
	return driver.HealthCheck{Name: driver.CheckForgetNotices, Status: driver.HealthOK, Value: "subscribed"}, true
}

// sleepCtx sleeps for d, or until ctx ends (then its cause).
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
