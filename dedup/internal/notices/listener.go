// Package notices is a Deduper's subscription to forget notices (docs/design.md
// §11): for each record Forget deletes, the store publishes its normalized key on
// the channel <prefix>:<handler>, and every Deduper subscribed drops it from its
// local tiers. A notice can be lost, so a subscription that is silent for two ticks
// (bound/2), or a channel not confirmed, drops whole tiers instead: a forgotten key
// leaves every tier within the bound.
package notices

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dedupkit/dedupkit/internal/storekit"
)

// Tier is one handler's local tier, as the listener sees it.
type Tier interface {
	// Channels are the channels of the handler's names (its name and former names).
	Channels() []string
	// Drop drops the normalized key k; Purge drops the whole tier.
	Drop(k string)
	Purge()
	// Listen says whether the tier may take keys: notices reach it.
	Listen(on bool)
}

// Listener is a subscription and its goroutine.
type Listener struct {
	sub    storekit.Sub
	tick   time.Duration // bound/4: how often it checks, and how much silence earns a PING
	log    *slog.Logger
	on     func(channel string) []Tier // the tiers on a channel; "" for all of them
	cancel context.CancelFunc
	done   chan struct{}
	state  atomic.Pointer[string] // what Health reports; nil while all is well
	warned atomic.Int64           // unix nanos of the last warning logged

	adds sync.WaitGroup // subscriptions being sent (Add)
}

// Start subscribes with sub and listens until Stop; bound is the forget bound.
func Start(sub storekit.Sub, bound time.Duration, log *slog.Logger, on func(channel string) []Tier) *Listener {
	ctx, cancel := context.WithCancel(context.Background())
	l := &Listener{sub: sub, tick: bound / 4, log: log, on: on, cancel: cancel, done: make(chan struct{})}
	go l.run(ctx)
	return l
}

// Add subscribes t's channels without waiting for the network: until the server
// confirms them, t is dropped at every check, and once more at the confirmation. An
// in-process subscription is made at once, and t listens from then on.
func (l *Listener) Add(t Tier) {
	if l.sub.InProcess() {
		_ = l.sub.Add(context.Background(), t.Channels()...) // no notice can be lost
		t.Listen(true)
		return
	}
	l.adds.Add(1)
	go func() {
		defer l.adds.Done()
		ctx, cancel := context.WithTimeout(context.Background(), l.tick)
		defer cancel()
		if err := l.sub.Add(ctx, t.Channels()...); err != nil {
			// retried on the next connection
			l.log.Debug("dedup: subscribing to forget notices failed; retrying", "channels", t.Channels(), "err", err)
		}
	}()
}

// Stop ends the subscription and waits for its goroutines, at most stopWait: one
// still being set up holds its connection until the client gives up on a server that
// does not answer.
func (l *Listener) Stop() {
	l.cancel()
	stopped := make(chan struct{})
	go func() {
		_ = l.sub.Close() // ends a receive or subscription waiting on the network
		<-l.done
		l.adds.Wait()
		close(stopped)
	}()
	t := time.NewTimer(stopWait)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		l.log.Debug("dedup: forget notices' subscription still waiting on the store at Close; it ends when the client gives up")
	}
}

const stopWait = 250 * time.Millisecond

// State is what is wrong with the subscription, if anything (Health).
func (l *Listener) State() (string, bool) {
	if s := l.state.Load(); s != nil {
		return *s, true
	}
	return "", false
}

func (l *Listener) run(ctx context.Context) {
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
			for _, t := range l.on("") {
				t.Listen(false)
			}
			l.warn("forget notices' connection failed", err)
			sleep(ctx, time.Until(next))
		}
		if now = time.Now(); now.Before(next) {
			continue
		}
		next = now.Add(l.tick)
		l.check(ctx, now.Sub(last), confirmed)
	}
}

func (l *Listener) handle(n storekit.Notice, confirmed map[string]bool) {
	switch n.Kind {
	case storekit.Subscribed:
		// notices sent before the confirmation were lost to this subscriber
		confirmed[n.Channel] = true
		for _, t := range l.on(n.Channel) {
			if !n.Lossless {
				t.Purge()
			}
			all := true
			for _, c := range t.Channels() {
				all = all && confirmed[c]
			}
			if all {
				t.Listen(true)
			}
		}
	case storekit.Forgotten:
		for _, t := range l.on(n.Channel) {
			t.Drop(n.K)
		}
	case storekit.Missed:
		l.warn("forget notices lost", errors.New("the queue of notices overflowed"))
		for _, t := range l.on("") {
			t.Purge()
		}
	}
}

// check runs every tick. A silent line gets a PING, whose reply comes before the
// next check, so only a dead line is silent for two ticks: that drops every tier, as
// a channel not confirmed drops its handlers' tiers.
func (l *Listener) check(ctx context.Context, silent time.Duration, confirmed map[string]bool) {
	if silent >= l.tick/2 {
		pctx, cancel := context.WithTimeout(ctx, l.tick/2)
		_ = l.sub.Ping(pctx) // its reply, or a failure, comes to run's receive
		cancel()
	}
	if silent >= 2*l.tick {
		for _, t := range l.on("") {
			t.Purge()
		}
		s := fmt.Sprintf("nothing heard from the forget notices' subscription for %v: every local tier is dropped every %v", silent.Round(time.Millisecond), l.tick)
		l.state.Store(&s)
		l.warn("forget notices silent", errors.New(s))
		return
	}
	var unconfirmed []string
	for _, t := range l.on("") {
		for _, c := range t.Channels() {
			if !confirmed[c] {
				unconfirmed = append(unconfirmed, c)
				t.Purge()
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
func (l *Listener) warn(msg string, err error) {
	now := time.Now().UnixNano()
	if w := l.warned.Load(); now-w < int64(time.Minute) || !l.warned.CompareAndSwap(w, now) {
		l.log.Debug("dedup: "+msg, "err", err)
		return
	}
	l.log.Warn("dedup: "+msg+"; local tiers are dropped until the subscription is back (a Redis ACL user needs &<prefix>:* +subscribe +ping)", "err", err)
}

// sleep sleeps for d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
