package redisstore_test

import (
	"context"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
)

// The Redis store accepts any redis.UniversalClient; miniredis stands in for Redis here.
func ExampleNew() {
	srv, _ := miniredis.Run()
	defer srv.Close()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()

	store, _ := redisstore.New(rdb)
	ctx := context.Background()
	// two processes, so the second learns of the first through Redis
	for i := 0; i < 2; i++ {
		d, _ := dedup.New(store)
		h, _ := d.Register("send-email")
		res, _ := h.Do(ctx, "welcome:user-7", func(context.Context) error { return nil })
		fmt.Println(res.Outcome, res.Tier)
		d.Close()
	}
	// Output:
	// processed none
	// duplicate store
}
