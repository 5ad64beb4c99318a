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
