package dedupkittest_test

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedupkittest"
)

// With no addresses given, StartServers starts both servers in process.
func ExampleStartServers() {
	srv, err := dedupkittest.StartServers("", "")
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	rdb := redis.NewClient(&redis.Options{Addr: srv.RedisAddr})
	defer rdb.Close()
	fmt.Println(rdb.Ping(context.Background()).Val())
	// Output: PONG
}
