package testenv

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Eventually checks cond every 10 ms until it holds, and fails the test once timeout
// has passed without it; what names the awaited state in the failure. The timeout
// only stops a hung test: nothing is measured by it.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// InfoField returns one field of an INFO section of c ("" when the server does not
// report it), waiting at most 5 s; an error fails the test.
func InfoField(t testing.TB, c redis.Cmdable, section, field string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := ReadInfoField(ctx, c, section, field)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// ReadInfoField is InfoField for a caller that rides out errors (a poll across a
// failover): it returns the error instead.
func ReadInfoField(ctx context.Context, c redis.Cmdable, section, field string) (string, error) {
	info, err := c.Info(ctx, section).Result()
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v, nil
		}
	}
	return "", nil
}
