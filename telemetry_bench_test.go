package subscriptions_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/exemplar"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
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

// telemetryCostEvents is the history one catch-up of
// BenchmarkTelemetryCost walks on each backend.
var telemetryCostEvents = map[string]int{"memory": 20_000, "postgres": 5_000}

// BenchmarkTelemetryCost reports what the instrumentation costs per event
// in a catch-up, with no SDK installed and with one (every span sampled
// into a batcher that drops them, metrics read by a ManualReader), on the
// memory backend (a no-op handler: the instrumentation's whole cost) and
// on Postgres (one upsert per event through TxFromContext, batches of
// 100: the realistic case). One op is one catch-up from position 0. Its
// figures per event are the process's CPU time (getrusage: other
// processes' load moves it less than the wall clock, though not nothing),
// its threads' voluntary context switches (a thread woken for a goroutine
// and parked again: what an SDK's span processor costs when spans end one
// at a time between round trips) and the heap allocations; compare each
// sdk line with its noop line. The sdk-noexemplars lines are the same SDK
// with the exemplar filter off: the cost of the exemplar the default
// (trace-based) filter stores for each handler-duration record made in a
// sampled span's context.
func BenchmarkTelemetryCost(b *testing.B) {
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	plainMeters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()),
		sdkmetric.WithExemplarFilter(exemplar.AlwaysOffFilter))
	traces := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardSpans{}))
	b.Cleanup(func() {
		require.NoError(b, meters.Shutdown(context.Background()))
		require.NoError(b, plainMeters.Shutdown(context.Background()))
		require.NoError(b, traces.Shutdown(context.Background()))
	})
	sdk := map[string][]subscriptions.SubscriberOption{
		"sdk":             {subscriptions.WithMeterProvider(meters), subscriptions.WithTracerProvider(traces)},
		"sdk-noexemplars": {subscriptions.WithMeterProvider(plainMeters), subscriptions.WithTracerProvider(traces)},
	}
	for _, backend := range []string{"memory", "postgres"} {
		for _, provider := range []string{"noop", "sdk", "sdk-noexemplars"} {
			b.Run(backend+"/"+provider, func(b *testing.B) {
				n := telemetryCostEvents[backend]
				opts := []subscriptions.SubscriberOption{subscriptions.WithBatchSize(100), subscriptions.WithPollInterval(time.Hour),
					subscriptions.WithLogger(quietLogger())}
				opts = append(opts, sdk[provider]...)
				var store domain.EventStore
				var newCheckpoints func(i int) (subscriptions.CheckpointStore, string)
				handler := coreNoop
				if backend == "memory" {
					store = infrastructure.NewMemoryStore()
					coreAppendBulk(b, store, n)
					newCheckpoints = func(i int) (subscriptions.CheckpointStore, string) {
						return subscriptions.NewMemoryCheckpointStore(), "bench"
					}
				} else {
					pg := dbtest.NewPostgres(b)
					events, err := infrastructure.NewGormEventStore(pg.DB)
					require.NoError(b, err)
					coreAppendBulk(b, events, n)
					require.NoError(b, pg.DB.Exec("CREATE TABLE core_bench_projection (event_id text PRIMARY KEY, position bigint NOT NULL, seen bigint NOT NULL)").Error)
					cps, err := subscriptions.NewGormCheckpointStore(pg.DB)
					require.NoError(b, err)
					store = events
					newCheckpoints = func(i int) (subscriptions.CheckpointStore, string) { return cps, fmt.Sprintf("bench-%d", i) }
					handler = func(ctx context.Context, ev coreEnvelope) error {
						return subscriptions.TxFromContext(ctx).Exec(coreBenchUpsert, ev.ID, ev.Position).Error
					}
				}
				b.ReportAllocs()
				runtime.GC()
				var ms0, ms1 runtime.MemStats
				runtime.ReadMemStats(&ms0)
				cpu0, switches0 := processUsage()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					cps, name := newCheckpoints(i)
					catchUp(b, store, cps, name, n, handler, opts...)
				}
				b.StopTimer()
				cpu, switches := processUsage()
				runtime.ReadMemStats(&ms1)
				events := float64(n) * float64(b.N)
				b.ReportMetric(float64((cpu-cpu0).Nanoseconds())/events, "cpu-ns/event")
				b.ReportMetric(float64(switches-switches0)/events, "switches/event")
				b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/events, "allocs/event")
				b.ReportMetric(float64(ms1.TotalAlloc-ms0.TotalAlloc)/events, "B/event")
			})
		}
	}
}

// BenchmarkStatusPostgres is one collection of the observable lag gauges
// on Postgres: a Status call (checkpoint, feed head, oldest unhandled
// event; no parking lot) for a subscriber 5,000 events behind, as during
// a catch-up. An SDK's periodic reader runs it once per collection
// interval; compare its time and CPU per op with the CPU per event of a
// catch-up times the events handled in one interval.
func BenchmarkStatusPostgres(b *testing.B) {
	pg := dbtest.NewPostgres(b)
	events, err := infrastructure.NewGormEventStore(pg.DB)
	require.NoError(b, err)
	coreAppendBulk(b, events, 5_000)
	cps, err := subscriptions.NewGormCheckpointStore(pg.DB)
	require.NoError(b, err)
	sub, err := subscriptions.NewSubscriber("status-bench", events, cps, coreNoop, subscriptions.WithLogger(quietLogger()))
	require.NoError(b, err)
	ctx := context.Background()
	st, err := sub.Status(ctx)
	require.NoError(b, err)
	require.Positive(b, st.Lag)
	b.ReportAllocs()
	cpu0, _ := processUsage()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := sub.Status(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	cpu, _ := processUsage()
	b.ReportMetric(float64((cpu-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
}
