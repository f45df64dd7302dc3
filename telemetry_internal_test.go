package subscriptions

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
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

// TestTelemetryHandlerSpansEndWithBatch: a batch's handler spans reach the
// span processor when the batch ends, not as each handler returns, and
// carry the times their handlers returned; a replay's span (no batch) is
// ended at once.
func TestTelemetryHandlerSpansEndWithBatch(t *testing.T) {
	ctx := context.Background()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	tel, err := newTelemetry("spans", nil, tp)
	require.NoError(t, err)
	events := make([]domain.EventEnvelope[any], 3)
	for i := range events {
		events[i] = domain.NewEventEnvelope[any](map[string]any{"n": i}, "agg", "span.test", i+1)
		events[i].Position = int64(i + 1)
	}
	h := func(context.Context, domain.EventEnvelope[any]) error { return nil }

	bctx, batch := tel.startBatch(ctx, events, 0, trace.SpanContext{})
	for _, ev := range events {
		require.NoError(t, batch.handle(bctx, h, ev, 1, time.Time{}))
	}
	require.Empty(t, rec.Ended(), "handler spans ended before their batch")
	batch.end(bctx, nil)

	ended := rec.Ended()
	require.Len(t, ended, len(events)+1)
	last := ended[len(ended)-1]
	require.Equal(t, SpanBatch, last.Name())
	for i, s := range ended[:len(events)] {
		require.Equal(t, SpanHandle, s.Name())
		require.Equal(t, last.SpanContext().SpanID(), s.Parent().SpanID())
		require.Contains(t, s.Attributes(), AttrEventPosition.Int64(int64(i+1)))
		require.False(t, s.EndTime().After(last.EndTime()), "handler span %d ends after its batch", i)
		if i > 0 {
			require.False(t, ended[i-1].EndTime().After(s.StartTime()),
				"handler span %d ends after the next handler started: it carries the batch's end, not its handler's", i-1)
		}
	}

	replay := tel.replayHandler(h)
	require.NoError(t, replay(ctx, events[0]))
	ended = rec.Ended()
	require.Len(t, ended, len(events)+2)
	require.Equal(t, SpanReplay, ended[len(ended)-1].Name())
}
