package subscriptions

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/eventfeed/subscriptions/domain"
)

// BenchmarkTelemetryHooks isolates what the instrumentation adds per event
// and per batch with no SDK installed (the global providers), next to the
// same calls with the instrumentation switched off: a catch-up's own
// timing on a shared machine is too noisy to show nanoseconds.
func BenchmarkTelemetryHooks(b *testing.B) {
	ctx := context.Background()
	events := []domain.EventEnvelope[any]{domain.NewEventEnvelope[any](map[string]any{"n": 1}, "agg", "bench.hook", 1)}
	events[0].Position = 1
	h := func(context.Context, domain.EventEnvelope[any]) error { return nil }
	// "metrics SDK": a meter provider with a reader, no tracing SDK: the
	// handler-duration record is taken per event.
	sdk := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
	for _, name := range []string{"off", "no SDK", "metrics SDK"} {
		var mp metric.MeterProvider
		if name == "metrics SDK" {
			mp = sdk
		}
		t, err := newTelemetry("bench", mp, nil)
		if err != nil {
			b.Fatal(err)
		}
		t.off = name == "off"
		b.Run("per event/"+name, func(b *testing.B) {
			_, span := t.startBatch(ctx, events, 0, trace.SpanContext{})
			b.ReportAllocs()
			for b.Loop() {
				if err := span.handle(ctx, h, events[0], 1, time.Time{}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("per batch/"+name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				bctx, span := t.startBatch(ctx, events, 0, trace.SpanContext{})
				t.committed(1)
				t.count(bctx, OutcomeHandled, 100)
				span.end(bctx, nil)
			}
		})
	}
}
