package nats

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedupkit/dedup"
)

// TxFunc is a transactional handler: it writes the message's effects with tx, the
// transaction its run's marker is written in (docs/design.md §9; dedup.DoTx). It returns an
// error to have the transaction rolled back and the message retried.
type TxFunc[T any] func(ctx context.Context, m *Msg, tx T) error

// HandleTx is JetStream.Handle for a transactional fn: the message runs through
// dedup.RunTx, in a transaction t opens with the run's marker, and is acknowledged
// by the result (after CommitUnknown, redelivered after a delay, for the marker to
// decide). t is a Transactor such as *sqltx.Transactor or *pgxtx.Transactor.
func HandleTx[T any](ctx context.Context, j *JetStream, msg jetstream.Msg, t dedup.Transactor[T], fn TxFunc[T]) (dedup.Result, Action) {
	if j == nil {
		noAdapterCtx(ctx, msg)
		return badInput, ActNakWithDelay
	}
	if isNil(msg) {
		j.cfg.logger.Error("dedup: HandleTx given a nil message; nothing to acknowledge", "handler", j.h.Name())
		return badInput, ActNone
	}
	if fn == nil || ctx == nil || isNil(t) {
		return badInput, j.settle(context.Background(), msg, viewJS(msg), badInput, ErrBadInput)
	}
	return j.handle(ctx, msg, func(ctx context.Context, key string, m *Msg) (dedup.Result, error) {
		return runOneTx(ctx, j.h, key, m.data, t, func(ctx context.Context, tx T) error { return fn(ctx, m, tx) })
	})
}

// TxHandler is JetStream.Handler for a transactional fn: it runs each message
// through HandleTx, in a transaction of its own, up to WithConcurrency at once.
// Pass Consume a short idle heartbeat, as for Handler. For one transaction per
// Fetch batch, use HandleBatchTx.
func TxHandler[T any](ctx context.Context, j *JetStream, t dedup.Transactor[T], fn TxFunc[T]) jetstream.MessageHandler {
	if j == nil {
		return noAdapter
	}
	if fn == nil || ctx == nil || isNil(t) {
		return j.refuse
	}
	ctx = dedup.WaitForRunning(ctx)
	dispatch := j.dispatcher()
	return func(msg jetstream.Msg) {
		if isNil(msg) {
			j.cfg.logger.Error("dedup: nil message handed to the handler; dropped", "handler", j.h.Name())
			return
		}
		dispatch(func() {
			defer j.nakOnPanic(msg)
			HandleTx(ctx, j, msg, t, fn)
		})
	}
}

// HandleBatchTx is JetStream.HandleBatch for a transactional fn: the messages the
// local tier does not answer run in one transaction (at most dedup.MaxTxBatch per
// transaction), as dedup.RunTx runs them: with no savepoint until one fails, then
// again, each behind a savepoint. Each message is acknowledged
// once its result is final. It returns batch.Error().
func HandleBatchTx[T any](ctx context.Context, j *JetStream, batch jetstream.MessageBatch, t dedup.Transactor[T], fn TxFunc[T]) ([]dedup.ItemResult, error) {
	if j == nil || isNil(batch) {
		return nil, ErrBadInput
	}
	msgs := drain(batch)
	if len(msgs) == 0 {
		return nil, batch.Error()
	}
	if fn == nil || ctx == nil || isNil(t) {
		out := make([]dedup.ItemResult, len(msgs))
		for i, msg := range msgs {
			out[i].Err = ErrBadInput
			j.settle(context.Background(), msg, viewJS(msg), badInput, ErrBadInput)
		}
		return out, ErrBadInput
	}
	return j.settleBatch(ctx, msgs, nil, func(items []dedup.Item, views []*Msg, done func(int, dedup.ItemResult)) []dedup.ItemResult {
		return dedup.RunTx(ctx, j.h, items, t, func(ctx context.Context, tx T, i int) error { return fn(ctx, views[i], tx) }, dedup.OnResult(done))
	}, func(ctx context.Context, it dedup.Item, m *Msg) (dedup.Result, error) {
		return runOneTx(ctx, j.h, it.Key, it.Payload, t, func(ctx context.Context, tx T) error { return fn(ctx, m, tx) })
	}), batch.Error()
}
