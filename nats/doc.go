// Package nats runs dedupkit handlers on NATS: JetStream consumers ([JetStream]:
// Consume, Messages and Fetch batches of nats.go/jetstream), core NATS
// subscriptions and push subscriptions of the older JetStreamContext ([Core]),
// and requests ([Replier]). Handlers are plain functions; the adapter runs them
// through a dedup.Handler and acknowledges each message by its outcome
// (docs/design.md §5):
//
//	outcome                      action
//	Processed, Duplicate         Ack (DoubleAck with WithDoubleAck)
//	NotRecorded                  Ack: running again would repeat the side effects
//	InProgress                   held up to DefaultCopyHold, checked again as the
//	                             other owner's run may end; then NakWithDelay(backoff,
//	                             at most what is left of that owner's lease)
//	Failed                       NakWithDelay(backoff by NumDelivered); on the last
//	                             delivery: the exhausted hook, then Term
//	Panicked                     Nak (on the last delivery: exhausted hook, then Term)
//	NoKey, KeyReuse              Term (the reason is logged, not sent)
//	StoreUnavailable             NakWithDelay(store retry delay)
//	LeaseLost, Cancelled         nothing: the message is redelivered after AckWait
//
// While a handler runs, the adapter marks its message in progress every
// AckWait/3, so a handler may run longer than AckWait.
//
// The default key ([DefaultKeyStrategy]) is the Idempotency-Key header, else
// Nats-Msg-Id, else, for a JetStream delivery, the stream name and sequence. A
// dedup handler registered WithKeyStrategy keeps its own strategy.
//
// A [Replier] answers the first request with fn's reply and every duplicate with
// the stored reply, byte for byte; one still in progress elsewhere gets a
// retryable 503 error reply: never silence.
//
// The package is named nats after its folder; import it under another name, for
// example dnats, beside github.com/nats-io/nats.go.
package nats
