// Package dedup makes message handlers idempotent: each (handler, message key) pair
// runs successfully at most once within the handler's retention, and no message is
// lost because of the dedup layer.
//
// A Deduper wraps a Store (package redisstore, or memstore for one process) and
// registers one Handler per name, each with its own settings:
//
//	d, _ := dedup.New(store)
//	h, _ := d.Register("charge-card", dedup.WithRetention(72*time.Hour))
//	res, err := h.Do(ctx, orderID, func(ctx context.Context) error {
//		return charge(ctx, order)
//	})
//
// Do claims the key with a lease, runs fn while a heartbeat extends the lease, and
// records DONE; a failed fn releases the claim for a redelivery. A local cache per
// handler answers known duplicates without a network call. Every outcome is a
// Result (see Outcome); errors are kept for real failures.
//
// The README is the introduction; docs/guarantees.md, docs/operating.md,
// docs/request-reply.md and docs/design.md hold the rest.
package dedup
