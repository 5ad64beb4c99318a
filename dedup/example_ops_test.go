package dedup_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/dedupkit/dedupkit/dedup"
	"github.com/dedupkit/dedupkit/dedup/memstore"
)

// Mount the health check on a mux: 200 with a JSON report while the store serves,
// 503 when it cannot.
func ExampleDeduper_HealthHandler() {
	store, _ := memstore.New()
	d, _ := dedup.New(store)
	defer d.Close()
	orders, _ := d.Register("orders", dedup.WithLocalCache(1000, 0))
	orders.Do(context.Background(), "order-1", func(context.Context) error { return nil })

	mux := http.NewServeMux()
	mux.Handle("/healthz/dedup", d.HealthHandler())

	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz/dedup", nil))
	fmt.Println(rec.Code)
	fmt.Print(rec.Body.String())
	// Output:
	// 200
	// {"status":"ok","checks":[{"name":"store.reachable","status":"ok","value":"memory","detail":"in process: 1 of 1048576 records"},{"name":"forget.notices","status":"ok","value":"subscribed"}],"local":[{"handler":"orders","len":1,"cap":1024}]}
}

// Turn on OpenTelemetry metrics with the application's MeterProvider (here an SDK
// provider read by hand).
func ExampleWithMeterProvider() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())

	store, _ := memstore.New()
	d, _ := dedup.New(store, dedup.WithMeterProvider(mp))
	defer d.Close()
	orders, _ := d.Register("orders")
	for _, id := range []string{"order-1", "order-1"} {
		orders.Do(context.Background(), id, func(context.Context) error { return nil })
	}

	var rm metricdata.ResourceMetrics
	_ = reader.Collect(context.Background(), &rm)
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name != "dedup.duplicates" {
			continue
		}
		for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
			tier, _ := p.Attributes.Value("dedup.tier")
			fmt.Println(m.Name, tier.AsString(), p.Value)
		}
	}
	// Unordered output:
	// dedup.duplicates local 1
	// dedup.duplicates store 0
}
