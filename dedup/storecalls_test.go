package dedup

import (
	"context"
	"time"

	"github.com/dedupkit/dedupkit/dedup/driver"
	"github.com/dedupkit/dedupkit/internal/storekit"
)

// The store's calls for one entry, as the tests make them.

func claim1(ctx context.Context, s driver.Store, key, token, fp string, lease time.Duration) (driver.Answer, error) {
	return storekit.Only(s.Claim(ctx, []driver.Entry{{Key: key, Token: token, Fingerprint: fp, TTL: lease}}))
}

func mark1(ctx context.Context, s driver.Store, key, token, fp string, retention time.Duration) (driver.Answer, error) {
	return storekit.Only(s.Mark(ctx, []driver.Entry{{Key: key, Token: token, Fingerprint: fp, TTL: retention}}))
}

func complete1(ctx context.Context, s driver.Store, key, token string, retention time.Duration) error {
	return storekit.OnlyErr(s.Complete(ctx, []driver.Entry{{Key: key, Token: token, TTL: retention}}))
}

func completeReply1(ctx context.Context, s driver.Store, key, token, reply string, retention time.Duration) error {
	return storekit.OnlyErr(s.Complete(ctx, []driver.Entry{{Key: key, Token: token, TTL: retention, Reply: reply, HasReply: true}}))
}

func release1(ctx context.Context, s driver.Store, key, token string) error {
	return storekit.OnlyErr(s.Release(ctx, []driver.Entry{{Key: key, Token: token}}))
}

func extend1(ctx context.Context, s driver.Store, key, token string, lease time.Duration) error {
	return storekit.OnlyErr(s.Extend(ctx, []driver.Entry{{Key: key, Token: token, TTL: lease}}))
}
