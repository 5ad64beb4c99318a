package memstore_test

import (
	"testing"

	"github.com/dedupkit/dedupkit/dedup/memstore"
	"github.com/dedupkit/dedupkit/dedup/storetest"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m, nil) }

func newBackend(t *testing.T) storetest.Backend {
	clk := storetest.NewClock()
	s, err := memstore.New(memstore.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	return storetest.Backend{Store: s, Prefix: testenv.Prefix(), Advance: clk.Add, Now: clk.Now}
}

func TestTheMemoryStorePassesTheConformanceSuite(t *testing.T) {
	storetest.Run(t, newBackend)
}

func TestTheMemoryStoreAgreesWithTheReferenceModel(t *testing.T) {
	storetest.RunModel(t, newBackend, storetest.ModelConfig{})
}
