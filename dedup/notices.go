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

// Forget notices: for each record Forget deletes, the store publishes its normalized
// key on the channel <prefix>:<handler>, and every Deduper subscribed drops it from
// its local tiers. A notice can be lost, so a subscription that is silent for two
// ticks (bound/2), or a channel not confirmed, drops whole tiers instead: a forgotten
// key leaves every tier within the bound (docs/design.md §11).

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

// noticeListener is a Deduper's subscription to forget notices and its goroutine.
type noticeListener struct {
	d      *Deduper
	sub    storekit.Sub
	tick   time.Duration // bound/4: how often it checks, and how much silence earns a PING
	cancel context.CancelFunc
	done   chan struct{}
	state  atomic.Pointer[string] // what Health reports; nil while all is well
	warned atomic.Int64           // unix nanos of the last warning logged

	adds sync.WaitGroup // subscriptions being sent (watchNotices)
}

// watchNotices subscribes the Deduper to the channels of h's names, without waiting
// for the network: until the server confirms them, h's local tier is dropped at every
// check, and once more at the confirmation.
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
		// subscribed at once, and no notice can be lost
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
			// retried on the next connection
			d.cfg.logger.Debug("dedup: subscribing to forget notices failed; retrying", "handler", h.name, "err", err)
		}
	}()
}

// stopNotices ends the subscription and waits for its goroutines, at most
// noticeStopWait: one still being set up holds its connection until the client gives
// up on a server that does not answer.
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
		_ = l.sub.Close() // ends a receive or subscription waiting on the network
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

const noticeStopWait = 250 * time.Millisecond

func (l *noticeListener) run(ctx context.Context) {
	defer close(l.done)
	confirmed := make(map[string]bool) // channels whose subscription the server confirmed
	last := time.Now()                 // when the subscription was last heard from
	next := last.Add(l.tick)           // the next check
	for ctx.Err() == nil {
		// the deadline bounds a redial: go-redis redials within receive
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
		case errors.As(err, &refused): // a SUBSCRIBE or PING refused, by an ACL
			l.warn("forget notices refused", refused.Err)
		default: // the connection failed; the next receive redials and resubscribes
			clear(confirmed)
			for _, h := range l.d.onChannel("") {
				h.listening.Store(false)
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

func (l *noticeListener) handle(n storekit.Notice, confirmed map[string]bool) {
	d := l.d
	switch n.Kind {
	case storekit.Subscribed:
		// notices sent before the confirmation were lost to this subscriber
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
				h.listening.Store(true)
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

// check runs every tick. A silent line gets a PING, whose reply comes before the
// next check, so only a dead line is silent for two ticks: that drops every tier, as
// a channel not confirmed drops its handlers' tiers.
func (l *noticeListener) check(ctx context.Context, silent time.Duration, confirmed map[string]bool) {
	d := l.d
	if silent >= l.tick/2 {
		pctx, cancel := context.WithTimeout(ctx, l.tick/2)
		_ = l.sub.Ping(pctx) // its reply, or a failure, comes to run's receive
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

// warn logs at Warn at most once a minute, at Debug between.
func (l *noticeListener) warn(msg string, err error) {
	now := time.Now().UnixNano()
	if w := l.warned.Load(); now-w < int64(time.Minute) || !l.warned.CompareAndSwap(w, now) {
		l.d.cfg.logger.Debug("dedup: "+msg, "err", err)
		return
	}
	l.d.cfg.logger.Warn("dedup: "+msg+"; local tiers are dropped until the subscription is back (a Redis ACL user needs &<prefix>:* +subscribe +ping)", "err", err)
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
