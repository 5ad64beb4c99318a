package nats

import (
	"fmt"
	"reflect"
	"runtime/debug"

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
