package dedupkittest

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
)

// DeleteKeys unlinks every key under prefix+":" with SCAN and UNLINK, never FLUSHDB
// (the server may be shared), on every master of a cluster. ctx bounds the clean-up.
func DeleteKeys(ctx context.Context, c redis.UniversalClient, prefix string) error {
	if cc, ok := c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return unlinkScanned(ctx, node, prefix)
		})
	}
	return unlinkScanned(ctx, c, prefix)
}

// unlinkScanned unlinks key by key: a cluster node refuses a multi-key UNLINK across
// slots.
func unlinkScanned(ctx context.Context, c redis.Cmdable, prefix string) error {
	iter := c.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	var batch []string
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range batch {
				p.Unlink(ctx, k)
			}
			return nil
		})
		batch = batch[:0]
		return err
	}
	var err error
	for err == nil && iter.Next(ctx) {
		if batch = append(batch, iter.Val()); len(batch) == 1000 {
			err = flush()
		}
	}
	return errors.Join(err, iter.Err(), flush())
}
