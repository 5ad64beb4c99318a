package dedup

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// BenchmarkDoMetrics is BenchmarkDo with metrics on (an SDK MeterProvider with a
// manual reader that is never read): the cost of the instruments on a local hit and
// on a call through the memory store. Compare with BenchmarkDo in the same run.
func BenchmarkDoMetrics(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	benchDo(b, ";metrics:on", WithMeterProvider(mp))
}
