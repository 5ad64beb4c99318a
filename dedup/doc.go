// Package dedup makes message handlers idempotent: each (handler, message key) pair
// runs successfully at most once inside the handler's retention window, and no
// message is lost because of the dedup layer.
//
// A check goes through two tiers. The local tier is a bounded TTL cache per handler
// that holds only keys known to be DONE; a hit answers Duplicate with no network call
// and no allocation. A miss goes to the Store (Redis, or memory for one process),
// where one atomic command or script claims the key:
//
//	d, _ := dedup.New(store)
//	h, _ := d.Register("charge-card", dedup.WithRetention(72*time.Hour))
//	res, err := h.Do(ctx, orderID, func(ctx context.Context) error {
//		return charge(ctx, order)
//	})
//
// Do claims the key with a lease (IN PROGRESS, owner token), runs fn while a
// heartbeat extends the lease every lease/3 to lease/2, then records DONE for the retention. A
// failed or panicking fn releases the claim so that a redelivery runs it again; a lost
// lease cancels fn's context. Every outcome is a Result value (see Outcome); errors
// are kept for real failures. Mark is the cheaper filter mode: one round trip, no
// lease, for side effects that are cheap to lose.
//
// A handler WithReplies stores a reply with DONE: Run's fn sets it (SetReply), and
// every duplicate gets the first run's reply back (ItemResult.Reply), from the local
// tier or the store. That is what request/reply needs: a client that retries after a
// timeout must get the answer, not silence. Replies are opaque bytes, bounded per
// handler, never logged:
//
//	h, _ := d.Register("create-order", dedup.WithReplies(0)) // replies up to 64 KiB
//	res := h.Run(ctx, []dedup.Item{{Key: requestID}}, func(ctx context.Context, _ int) error {
//		return dedup.SetReply(ctx, createOrder(ctx, req))
//	})[0]
//	// res.Reply: this run's reply, or, for a Duplicate, the first run's
//
// Owner tokens make every store call safe to retry: a claim or mark whose reply was
// lost, and which go-redis sends again, finds its own token and is recognised as its
// own instead of being taken for a duplicate.
//
// Handlers are independent: each has its own name (part of every Redis key), retention,
// lease, local tier, key strategy (package keys), missing-key policy, store-failure
// policy (fail closed by default), fingerprinting and mode.
//
// For operations: WithMeterProvider turns on OpenTelemetry metrics (its doc lists
// every instrument; without it they cost nothing). Log lines (WithLogger) name a key
// by a hash of it, never the key or the payload. Deduper.Health, and HealthHandler
// for an HTTP mux, report whether the store is reachable and how fast, risky Redis
// settings (an evicting maxmemory-policy, a version older than 7.0, memory near
// maxmemory) and the fill of every local tier.
package dedup
