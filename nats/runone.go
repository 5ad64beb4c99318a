package nats

import (
	"context"

	"github.com/dedupkit/dedupkit/dedup"
)

// runOne runs one message, key and payload, through h.Run: a single call. A
// WhenChecked callback in ctx is not its to call.
func runOne(ctx context.Context, h *dedup.Handler, key string, payload []byte, fn func(context.Context) error) (dedup.Result, error) {
	r := h.Run(dedup.WhenChecked(ctx, nil), []dedup.Item{{Key: key, Payload: payload}}, func(ctx context.Context, _ int) error { return fn(ctx) })[0]
	return r.Result, r.Err
}

// runOneTx is runOne for a transactional fn, through dedup.RunTx.
func runOneTx[T any](ctx context.Context, h *dedup.Handler, key string, payload []byte, t dedup.Transactor[T], fn func(context.Context, T) error) (dedup.Result, error) {
	r := dedup.RunTx(dedup.WhenChecked(ctx, nil), h, []dedup.Item{{Key: key, Payload: payload}}, t, func(ctx context.Context, tx T, _ int) error { return fn(ctx, tx) })[0]
	return r.Result, r.Err
}
