// Package nats runs dedupkit handlers on NATS: JetStream consumers (Consume, Messages
// and Fetch batches from nats.go/jetstream), core NATS subscriptions, and push
// subscriptions of the older JetStreamContext. Handlers are plain functions; the
// adapter runs them through a dedup.Handler and turns every outcome into the right
// acknowledgement (docs/design.md §5):
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
//	NoKey, KeyReuse              Term (the reason is logged, not sent: servers
//	                             before 2.10.4 ignore a Term that carries one)
//	StoreUnavailable             NakWithDelay(store retry delay)
//	LeaseLost, Cancelled         nothing: the message is redelivered after AckWait
//
// While a handler runs, the adapter tells the server the message is in progress every
// AckWait/3, so a handler may run longer than AckWait without being redelivered.
//
// The default key (DefaultKeyStrategy), the same for every adapter and the engine, is
// the Idempotency-Key header, else Nats-Msg-Id, else, for a JetStream delivery, the
// stream name and stream sequence (stable across redeliveries, not across
// republishes). A dedup handler registered WithKeyStrategy keeps its own strategy.
//
// Requests are answered by a Replier (core NATS Handler, or a nats.go/micro endpoint's
// MicroHandler) over a handler that stores replies (dedup.WithReplies): the first
// request runs fn and gets its reply, every duplicate gets the stored reply byte for
// byte, headers included, and one still in progress elsewhere a retryable 503 error
// reply (micro's Nats-Service-Error and Nats-Service-Error-Code headers): never
// silence. See Replier for every answer.
//
// The package is named nats after its folder; import it under another name, for
// example dnats, beside github.com/nats-io/nats.go.
package nats
