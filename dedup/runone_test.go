package dedup

import (
	"context"

	"github.com/dedupkit/dedupkit/keys"
)

// replying is the fn of a run on a handler WithReplies whose reply f returns
// (SetReply). Outside such a run it fails before f runs.
func replying(f func(context.Context) ([]byte, error)) func(context.Context) error {
	return func(ctx context.Context) error {
		if err := SetReply(ctx, nil); err != nil {
			return err
		}
		b, err := f(ctx)
		if err != nil {
			return err
		}
		return SetReply(ctx, b)
	}
}

// replyingEach is replying for a batch's fn.
func replyingEach(f func(context.Context, int) ([]byte, error)) func(context.Context, int) error {
	return func(ctx context.Context, i int) error {
		return replying(func(ctx context.Context) ([]byte, error) { return f(ctx, i) })(ctx)
	}
}

// runReply runs one request, key and payload, on h with Run, whose f returns the
// reply, and returns its result and error.
func runReply(h *Handler, ctx context.Context, key string, payload []byte, f func(context.Context) ([]byte, error)) (ItemResult, error) {
	r := h.Run(ctx, []Item{{Key: key, Payload: payload}}, func(ctx context.Context, _ int) error { return replying(f)(ctx) })
	if len(r) == 0 {
		return ItemResult{}, nil
	}
	return r[0], r[0].Err
}

// runReplyMsg is runReply for a message, its key read with h's key strategy.
func runReplyMsg(h *Handler, ctx context.Context, msg keys.Message, f func(context.Context) ([]byte, error)) (ItemResult, error) {
	key, payload, err := h.readMessage(msg)
	if err != nil {
		return ItemResult{}, err
	}
	return runReply(h, ctx, key, payload, f)
}

// handleKey runs one message, key and payload, on h with Run (a single call: the
// handler's mode, fingerprinting), and returns its result and error.
func handleKey(h *Handler, ctx context.Context, key string, payload []byte, fn func(context.Context) error) (Result, error) {
	var run func(context.Context, int) error
	if fn != nil {
		run = func(ctx context.Context, _ int) error { return fn(ctx) }
	}
	r := h.Run(ctx, []Item{{Key: key, Payload: payload}}, run)
	return r[0].Result, r[0].Err
}

// handleKeyTx is handleKey for a transactional fn, with RunTx.
func handleKeyTx[T any](ctx context.Context, h *Handler, key string, payload []byte, t Transactor[T], fn func(context.Context, T) error) (Result, error) {
	var run func(context.Context, T, int) error
	if fn != nil {
		run = func(ctx context.Context, tx T, _ int) error { return fn(ctx, tx) }
	}
	r := RunTx(ctx, h, []Item{{Key: key, Payload: payload}}, t, run)
	return r[0].Result, r[0].Err
}

// handleTx is handleKeyTx for a message, its key read with h's key strategy.
func handleTx[T any](ctx context.Context, h *Handler, msg keys.Message, t Transactor[T], fn func(context.Context, T) error) (Result, error) {
	key, payload, err := h.readMessage(msg)
	if err != nil {
		return Result{}, err
	}
	return handleKeyTx(ctx, h, key, payload, t, fn)
}

// asBatch keeps a Run of one item on the batch path (ClaimMany, MarkMany): a Run
// with OnResult is a batch, whatever its length.
var asBatch = OnResult(func(int, ItemResult) {})
