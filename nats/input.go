package nats

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"runtime/debug"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedupkit/dedup"
)

// Bad input to the adapter is an error or a logged refusal, never a panic on a
// library goroutine: a nil message is dropped with a log line (there is nothing to
// acknowledge), a nil function or context answers ErrBadInput and the message is
// Nak'ed with the failure backoff, and anything the adapter cannot map is recovered,
// logged, and its messages Nak'ed.

// ErrBadInput reports a call given a nil message, function or context; it wraps
// dedup.ErrInvalidOption.
var ErrBadInput = fmt.Errorf("%w: nats: nil message, function or context", dedup.ErrInvalidOption)

// badInput is the result of a delivery the adapter cannot run: no outcome (the
// zero, "invalid"), Nak'ed after the failure backoff (action) with a log line.
var badInput = dedup.Result{}

// isNil reports an interface that is nil or holds a nil pointer.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch r := reflect.ValueOf(v); r.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Chan, reflect.Interface, reflect.Slice:
		return r.IsNil()
	}
	return false
}

// nakOnPanic, deferred around the handling of ack's message, recovers a panic of the
// adapter's own code (a message whose methods panic), logs it and Naks the message,
// itself protected: a message that cannot even be Nak'ed is redelivered after AckWait.
func (a *adapter) nakOnPanic(ack acker) {
	r := recover()
	if r == nil {
		return
	}
	a.cfg.logger.Error("dedup: the adapter recovered from a panic; Nak'ing the message", "handler", a.h.Name(), "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
	if isNil(ack) {
		return
	}
	defer func() { _ = recover() }()
	if ack.Nak() == nil {
		a.stats.actions[ActNak].Add(1)
	}
}

// recovered logs a panic of the adapter's own code (fn's panics are the engine's to
// recover) on a goroutine the adapter started; the messages it held were settled
// by their defers (Nak'ed as after a panic).
func (a *adapter) recovered() {
	if r := recover(); r != nil {
		a.cfg.logger.Error("dedup: the adapter recovered from a panic; its messages were Nak'ed", "handler", a.h.Name(), "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
	}
}

// noAdapter settles a delivery handed to a nil *JetStream (a NewJetStream whose
// error was dropped): logged on slog.Default and Nak'ed after the default backoff,
// never dropped silently.
func noAdapter(msg jetstream.Msg) {
	slog.Default().Error("dedup: message handed to a nil *JetStream adapter (did NewJetStream fail?); Nak'ing it")
	if isNil(msg) {
		return
	}
	defer func() { _ = recover() }()
	n := uint64(1)
	if md, err := msg.Metadata(); err == nil {
		n = md.NumDelivered
	}
	_ = msg.NakWithDelay(DefaultBackoff(n))
}

// noAdapterCtx is noAdapter for the calls that take a context.
func noAdapterCtx(_ context.Context, msg jetstream.Msg) { noAdapter(msg) }

// Wait blocks until every message already handed to a Handler has been handled and
// acknowledged. Stop (or drain) the consumer first, then call Wait before closing the
// Deduper or the connection. A Handler's idle goroutines end 100 ms after its last
// batch, or as soon as its context ends. A nil *JetStream has none.
func (j *JetStream) Wait() {
	if j != nil {
		j.adapter.Wait()
	}
}

// Stats returns what the adapter has done so far; zero for a nil *JetStream.
func (j *JetStream) Stats() Stats {
	if j == nil {
		return Stats{}
	}
	return j.adapter.Stats()
}

// Wait blocks until every message already handed to a Handler has been handled. A
// nil *Core has none.
func (c *Core) Wait() {
	if c != nil {
		c.adapter.Wait()
	}
}

// Stats returns what the adapter has done so far; zero for a nil *Core.
func (c *Core) Stats() Stats {
	if c == nil {
		return Stats{}
	}
	return c.adapter.Stats()
}
