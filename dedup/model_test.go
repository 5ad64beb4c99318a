package dedup

import (
	"context"
	"testing"
	"time"

	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/dedup/storetest"
	"github.com/dedupkit/dedupkit/internal/testenv"
	"github.com/dedupkit/dedupkit/lru"
)

// The engine agrees with storetest's reference model: on fake clocks the model's
// sequences also drive a handler (Do, Mark, a failing Do, a Do whose fn calls Do and
// Mark for its own key) with a local tier on the store's clock. Above all, the local
// tier answers Duplicate only for a record the model holds DONE, never for one IN
// PROGRESS or gone.
func TestTheEngineAgreesWithTheReferenceModel(t *testing.T) {
	cfg := storetest.ModelConfig{Engine: modelEngine}
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		c := cfg
		c.Seeds = 40
		storetest.RunModel(t, func(t *testing.T) storetest.Backend {
			clk := storetest.NewClock()
			s, err := memstore.New(memstore.WithClock(clk.Now))
			if err != nil {
				t.Fatal(err)
			}
			return storetest.Backend{Store: s, Prefix: testenv.Prefix(), Advance: clk.Add, Now: clk.Now}
		}, c)
	})
	t.Run("miniredis", func(t *testing.T) {
		t.Parallel()
		storetest.RunModel(t, func(t *testing.T) storetest.Backend {
			m, c := testenv.Miniredis(t)
			clk := storetest.NewClock()
			s, err := redisstore.New(c)
			if err != nil {
				t.Fatal(err)
			}
			return storetest.Backend{Store: s, Prefix: testenv.Prefix(), Now: clk.Now,
				Advance: func(d time.Duration) { m.FastForward(d); clk.Add(d) }}
		}, cfg)
	})
}

// modelEngine is the handler the model drives: a lease far beyond the run (no
// heartbeat fires while fn runs), the local tier on the store's fake clock.
func modelEngine(t *testing.T, b storetest.Backend, retention time.Duration) storetest.Engine {
	d, err := New(b.Store, WithPrefix(b.Prefix), WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	h, err := d.Register("model", WithRetention(retention), WithLease(time.Minute),
		WithLocalCache(64, 0), withLocalOpts(lru.WithClock(b.Now)))
	if err != nil {
		t.Fatal(err)
	}
	return engine{h}
}

type engine struct{ h *Handler }

func engineResult(r Result) storetest.EngineResult {
	return storetest.EngineResult{Outcome: r.Outcome.String(), Local: r.Tier == TierLocal, RetryAfter: r.RetryAfter}
}

func (e engine) Do(ctx context.Context, key string, fn func(context.Context) error) storetest.EngineResult {
	r, _ := e.h.Do(ctx, key, fn)
	return engineResult(r)
}

func (e engine) Mark(ctx context.Context, key string) storetest.EngineResult {
	r, _ := e.h.Mark(ctx, key)
	return engineResult(r)
}

// withLocalOpts builds the handler's local tier with opts (a fake clock).
func withLocalOpts(opts ...lru.Option) HandlerOption {
	return func(c *handlerConfig) error {
		c.localOpts = opts
		return nil
	}
}
