package dedup

import (
	"context"
	"fmt"
	"reflect"

	"github.com/dedupkit/dedupkit/keys"
)

// Bad input to an entry point is an error wrapping ErrInvalidOption, never a panic.

// checkInput reports a nil h, ctx or (fnNil) fn.
func (h *Handler) checkInput(ctx context.Context, fnNil bool) error {
	switch {
	case h == nil:
		return fmt.Errorf("%w: nil *Handler (did Register fail?)", ErrInvalidOption)
	case h.d == nil:
		return fmt.Errorf("%w: a Handler not made by Deduper.Register", ErrInvalidOption)
	case ctx == nil:
		return fmt.Errorf("%w: nil context", ErrInvalidOption)
	case fnNil:
		return fmt.Errorf("%w: nil handler function", ErrInvalidOption)
	}
	return nil
}

// checkTx is checkInput for a transactional call.
func checkTx[T any](ctx context.Context, h *Handler, t Transactor[T], fnNil bool) error {
	if err := h.checkInput(ctx, fnNil); err != nil {
		return err
	}
	if isNil(t) {
		return fmt.Errorf("%w: nil transactor", ErrInvalidOption)
	}
	if h.cfg.replyLimit > 0 {
		return fmt.Errorf("%w: handler %q stores replies (WithReplies), which a transactional run does not: register one without", ErrInvalidOption, h.name)
	}
	return nil
}

// isNil reports an interface that is nil or holds a nil pointer (or map, func...).
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch r := reflect.ValueOf(v); r.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Chan, reflect.Slice, reflect.Interface:
		return r.IsNil()
	}
	return false
}

// readMessage reads msg's key and payload. A nil message, or one whose methods
// panic (a typed nil), is an error.
func (h *Handler) readMessage(msg keys.Message) (key string, payload []byte, err error) {
	if isNil(msg) {
		return "", nil, fmt.Errorf("%w: nil message", ErrInvalidOption)
	}
	defer func() {
		if r := recover(); r != nil {
			key, payload, err = "", nil, fmt.Errorf("%w: reading the message: %v", ErrInvalidOption, r)
		}
	}()
	return h.cfg.strategy.Key(msg), msg.Data(), nil
}

// badBatch fails every item with err, and tells done of each.
func badBatch(items []Item, done func(int, ItemResult), err error) []ItemResult {
	out := make([]ItemResult, len(items))
	for i := range out {
		out[i].Err = err
		if done != nil {
			done(i, out[i])
		}
	}
	return out
}
