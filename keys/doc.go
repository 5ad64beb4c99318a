// Package keys derives message keys from messages and turns them into bounded,
// Redis-safe record keys.
//
// A [Strategy] reads a [Message] (headers and payload) and returns its key, or ""
// when the message has none. The built-in strategies are:
//
//   - [Header]: the first value of a named header, e.g. "Nats-Msg-Id" or "Idempotency-Key".
//   - [CorrelationID]: "Correlation-Id", else "X-Correlation-Id".
//   - [Composite]: several strategies joined with length prefixes, so that
//     ("a|b", "c") and ("a", "b|c") never produce the same key.
//   - [Payload]: the SHA-256 of the payload.
//   - [Custom]: any func(Message) string.
//   - [FirstOf]: the first strategy in a list that finds a key.
//
// Strategies return keys raw, whatever their size or content, and never panic.
// Strategies that can be misconfigured also implement [Validator]; the dedup
// engine calls Validate when a handler is registered.
//
// [Normalize] bounds a raw key: a short key made only of plain bytes is used as
// is, anything else becomes "~" followed by its SHA-256 in hex, and the two forms
// cannot collide. [RecordKey] builds the full Redis key
// "<prefix>:<handler>:<normalized key>"; [ValidateName] and [ValidatePrefix]
// check its other two parts. Every validation error wraps [ErrInvalid].
package keys
