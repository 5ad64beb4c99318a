package dedup

import (
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

func clusterBackend(t *testing.T) backend {
	prefix := testenv.Prefix()
	c := testenv.Cluster(t, prefix)
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return backend{store: s, prefix: prefix, advance: time.Sleep, rdb: c}
}
