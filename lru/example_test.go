package lru_test

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/dedupkit/dedupkit/lru"
)

// A handler checks the local tier before asking the shared store, and adds
// a message's key only once the message is known to be processed.
func Example() {
	done, err := lru.New(100_000, 10*time.Minute)
	if err != nil {
		panic(err)
	}
	defer done.Close()

	for _, id := range []string{"order-41", "order-42", "order-41"} {
		if done.Contains(id) {
			fmt.Println(id, "duplicate")
			continue
		}
		fmt.Println(id, "process")
		done.Add(id) // after the handler succeeded
	}
	// Output:
	// order-41 process
	// order-42 process
	// order-41 duplicate
}

// Expiry is lazy and measured from the last Add; WithClock makes it testable.
func ExampleWithClock() {
	var now atomic.Int64 // nanoseconds of fake time
	clock := func() time.Time { return time.Unix(0, now.Load()) }

	c, err := lru.New(10, time.Minute, lru.WithClock(clock))
	if err != nil {
		panic(err)
	}
	defer c.Close()

	c.Add("k")
	now.Add(int64(59 * time.Second))
	fmt.Println(c.Contains("k"))
	now.Add(int64(time.Second))
	fmt.Println(c.Contains("k"), c.Len())
	// Output:
	// true
	// false 1
}

func ExampleNew_invalid() {
	_, err := lru.New(0, time.Minute)
	fmt.Println(err)
	// Output: lru: invalid option: size 0, must be at least 1
}
