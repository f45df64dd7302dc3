package subscriptions_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
)

// telemetryBenchEvents is the history one catch-up of the telemetry
// benchmark walks.
const telemetryBenchEvents = 20_000

// discardSpans is a span exporter that drops everything: the tracing SDK
// does all its work (sampling, recording, batching) and nothing leaves.
type discardSpans struct{}

func (discardSpans) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardSpans) Shutdown(context.Context) error                             { return nil }

// telemetryCatchUp times one subscriber catching up on store (from 0, on
// a fresh checkpoint store) with a no-op handler, the worst case for
// relative overhead.
func telemetryCatchUp(b *testing.B, store domain.EventStore, opts ...subscriptions.SubscriberOption) time.Duration {
	b.Helper()
	var seen atomic.Int64
	done := make(chan struct{})
	h := func(context.Context, domain.EventEnvelope[any]) error {
		if seen.Add(1) == telemetryBenchEvents {
			close(done)
		}
		return nil
	}
	all := append([]subscriptions.SubscriberOption{subscriptions.WithBatchSize(100), subscriptions.WithPollInterval(time.Hour),
		subscriptions.WithLogger(quietLogger())}, opts...)
	sub, err := subscriptions.NewSubscriber("bench", store, subscriptions.NewMemoryCheckpointStore(), h, all...)
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	result := make(chan error, 1)
	began := time.Now()
	go func() { result <- sub.Run(ctx) }()
	<-done
	took := time.Since(began)
	cancel()
	require.NoError(b, <-result)
	return took
}

// BenchmarkTelemetryOverhead measures what the instrumentation costs a
// catch-up on the memory backend (no I/O, so the overhead is as visible as
// it can be), three ways in each iteration, in rotating order:
//
//   - baseline: the instrumentation removed (a test-only switch);
//   - noop: the default, global providers with no SDK installed;
//   - sdk: an SDK MeterProvider (ManualReader) and TracerProvider
//     (always sampled, batching into an exporter that drops the spans).
//
// It reports each median in ns/event and the ratios to the baseline.
func BenchmarkTelemetryOverhead(b *testing.B) {
	store := infrastructure.NewMemoryStore()
	coreAppendBulk(b, store, telemetryBenchEvents)
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	traces := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardSpans{}))
	b.Cleanup(func() {
		require.NoError(b, meters.Shutdown(context.Background()))
		require.NoError(b, traces.Shutdown(context.Background()))
	})
	configs := []struct {
		name string
		opts []subscriptions.SubscriberOption
	}{
		{"baseline", []subscriptions.SubscriberOption{subscriptions.WithoutTelemetryForTest()}},
		{"noop", nil},
		{"sdk", []subscriptions.SubscriberOption{subscriptions.WithMeterProvider(meters), subscriptions.WithTracerProvider(traces)}},
	}
	took := make([][]time.Duration, len(configs))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range configs {
			c := (i + j) % len(configs)
			took[c] = append(took[c], telemetryCatchUp(b, store, configs[c].opts...))
		}
	}
	b.StopTimer()
	perEvent := make([]float64, len(configs))
	for c, cfg := range configs {
		perEvent[c] = float64(coreMedian(took[c]).Nanoseconds()) / telemetryBenchEvents
		b.ReportMetric(perEvent[c], cfg.name+"-ns/event")
	}
	b.ReportMetric(perEvent[1]/perEvent[0], "noop/baseline")
	b.ReportMetric(perEvent[2]/perEvent[0], "sdk/baseline")
}
