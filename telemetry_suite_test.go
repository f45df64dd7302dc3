package subscriptions_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

// telemetryKit is an OpenTelemetry SDK with in-memory readers: a
// ManualReader for metrics and a span recorder.
type telemetryKit struct {
	reader *sdkmetric.ManualReader
	meters *sdkmetric.MeterProvider
	spans  *tracetest.SpanRecorder
	traces *sdktrace.TracerProvider
}

func newTelemetryKit(t testing.TB) *telemetryKit {
	k := &telemetryKit{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	k.meters = sdkmetric.NewMeterProvider(sdkmetric.WithReader(k.reader))
	k.traces = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(k.spans))
	t.Cleanup(func() {
		require.NoError(t, k.meters.Shutdown(context.Background()))
		require.NoError(t, k.traces.Shutdown(context.Background()))
	})
	return k
}

func (k *telemetryKit) options() []subscriptions.SubscriberOption {
	return []subscriptions.SubscriberOption{subscriptions.WithMeterProvider(k.meters), subscriptions.WithTracerProvider(k.traces)}
}

// collect reads every metric once.
func (k *telemetryKit) collect(t testing.TB) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, k.reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != subscriptions.InstrumentationName {
			continue
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// events returns subscriptions.events for one subscriber and outcome.
func telemetryCount(t testing.TB, ms map[string]metricdata.Aggregation, subscriber, outcome string) int64 {
	t.Helper()
	data, ok := ms[subscriptions.MetricEvents]
	if !ok {
		return 0
	}
	sum, ok := data.(metricdata.Sum[int64])
	require.True(t, ok, "%s is a %T", subscriptions.MetricEvents, data)
	require.True(t, sum.IsMonotonic)
	for _, dp := range sum.DataPoints {
		s, _ := dp.Attributes.Value(subscriptions.AttrSubscriber)
		o, _ := dp.Attributes.Value(subscriptions.AttrOutcome)
		if s.AsString() == subscriber && o.AsString() == outcome {
			return dp.Value
		}
	}
	return 0
}

// telemetryHistCount returns how many values a histogram recorded for a
// subscriber.
func telemetryHistCount(t testing.TB, ms map[string]metricdata.Aggregation, name, subscriber string) uint64 {
	t.Helper()
	data, ok := ms[name]
	if !ok {
		return 0
	}
	h, ok := data.(metricdata.Histogram[float64])
	require.True(t, ok, "%s is a %T", name, data)
	for _, dp := range h.DataPoints {
		if s, _ := dp.Attributes.Value(subscriptions.AttrSubscriber); s.AsString() == subscriber {
			if m, ok := dp.Min.Value(); ok {
				require.GreaterOrEqual(t, m, 0.0, "%s: negative duration", name)
			}
			return dp.Count
		}
	}
	return 0
}

// telemetryGauge returns an observable instrument's value for a
// subscriber as float64 (a gauge, or the non-monotonic sum of an up-down
// counter); false when it has no data point. It fails the test when the
// subscriber has more than one series.
func telemetryGauge(t testing.TB, ms map[string]metricdata.Aggregation, name, subscriber string) (float64, bool) {
	t.Helper()
	var values []float64
	match := func(attrs attribute.Set) bool {
		s, _ := attrs.Value(subscriptions.AttrSubscriber)
		return s.AsString() == subscriber
	}
	switch g := ms[name].(type) {
	case metricdata.Gauge[int64]:
		for _, dp := range g.DataPoints {
			if match(dp.Attributes) {
				values = append(values, float64(dp.Value))
			}
		}
	case metricdata.Gauge[float64]:
		for _, dp := range g.DataPoints {
			if match(dp.Attributes) {
				values = append(values, dp.Value)
			}
		}
	case metricdata.Sum[int64]:
		require.False(t, g.IsMonotonic, "%s is an up-down counter", name)
		for _, dp := range g.DataPoints {
			if match(dp.Attributes) {
				values = append(values, float64(dp.Value))
			}
		}
	case nil:
	default:
		t.Fatalf("%s is a %T", name, g)
	}
	require.LessOrEqual(t, len(values), 1, "%s: %d series for %q", name, len(values), subscriber)
	if len(values) == 0 {
		return 0, false
	}
	return values[0], true
}

func spanAttr(s sdktrace.ReadOnlySpan, key attribute.Key) attribute.Value {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// TestTelemetrySuite runs a subscriber through a poison event, a replay
// and a reset on every backend, with the SDK's in-memory readers, and
// checks that each metric moves and each span nests and links as
// docs/observability.md says. The events are appended under an
// application span through TracingEventStore, so on the database backends
// the link crosses the database (metadata stored and read back).
func TestTelemetrySuite(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ctx := context.Background()
			kit := newTelemetryKit(t)
			app := newTelemetryKit(t) // the application's own tracing

			notifier := subscriptions.NewInProcessNotifier()
			appendStore := subscriptions.NewNotifyingEventStore(subscriptions.NewTracingEventStore(e.Events), notifier.Notify)

			var fixed atomic.Bool
			handler := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
				if !trace.SpanContextFromContext(ctx).IsValid() {
					return errors.New("handler context carries no span")
				}
				if ev.EventType == "tele.poison" && !fixed.Load() {
					return fmt.Errorf("poison %s", ev.ID)
				}
				return nil
			}
			const name = "tele-suite"
			opts := append(kit.options(),
				subscriptions.WithParkingLot(e.Parking), subscriptions.WithMaxRetries(1),
				subscriptions.WithRetryBackoff(time.Millisecond, time.Millisecond),
				// Only wake signals (and Notify calls below) move it: the run
				// is deterministic.
				subscriptions.WithPollInterval(time.Hour), subscriptions.WithWakeSignal(notifier.Subscribe()),
				subscriptions.WithLogger(quietLogger()))
			sub, err := subscriptions.NewSubscriber(name, e.Events, e.Checkpoints, handler, opts...)
			require.NoError(t, err)

			waitState := func(want subscriptions.State, lag int64) subscriptions.Status {
				t.Helper()
				var st subscriptions.Status
				require.Eventually(t, func() bool {
					st, err = sub.Status(ctx)
					return err == nil && st.State == want && st.Lag == lag
				}, 30*time.Second, 2*time.Millisecond, "want state %s lag %d; last %+v, %v", want, lag, st, err)
				return st
			}

			run := start(t, sub)
			waitState(subscriptions.StateIdle, 0)

			// Five events appended in one request span, created a minute
			// ago so that the lag in time is unmistakable.
			reqCtx, req := app.traces.Tracer("app").Start(ctx, "request")
			types := []string{"tele.ok", "tele.ok", "tele.poison", "tele.ok", "tele.ok"}
			evs := make([]domain.EventEnvelope[any], len(types))
			for i, typ := range types {
				evs[i] = domain.NewEventEnvelope[any](map[string]any{"i": i}, "tele-agg", typ, i+1)
				evs[i].Created = time.Now().Add(-time.Minute)
			}
			require.NoError(t, appendStore.Append(reqCtx, "tele-agg", 0, evs...))
			req.End()
			require.Empty(t, evs[0].Metadata, "the caller's envelope is not modified")
			appended := req.SpanContext()

			st := waitState(subscriptions.StateIdle, 0)
			require.Equal(t, 1, st.Parked)
			require.Equal(t, evs[2].ID, st.LastErrorEvent.ID)
			require.Contains(t, st.LastError, "poison")

			ms := kit.collect(t)
			require.EqualValues(t, 4, telemetryCount(t, ms, name, subscriptions.OutcomeHandled))
			require.EqualValues(t, 1, telemetryCount(t, ms, name, subscriptions.OutcomeRetried))
			require.EqualValues(t, 1, telemetryCount(t, ms, name, subscriptions.OutcomeParked))
			require.EqualValues(t, 0, telemetryCount(t, ms, name, subscriptions.OutcomeFailed))
			require.EqualValues(t, 0, telemetryCount(t, ms, name, subscriptions.OutcomeReplayed))
			// Handler calls: 2 (rolled back with the poison) + 2 (their own
			// batch) + 2 attempts at the poison + 2 after it.
			require.EqualValues(t, 8, telemetryHistCount(t, ms, subscriptions.MetricHandlerDuration, name))
			require.GreaterOrEqual(t, telemetryHistCount(t, ms, subscriptions.MetricBatchDuration, name), uint64(4))
			require.EqualValues(t, 1, telemetryHistCount(t, ms, subscriptions.MetricWakeDuration, name), "one wake led to handler calls")
			lag, ok := telemetryGauge(t, ms, subscriptions.MetricLagEvents, name)
			require.True(t, ok)
			require.Zero(t, lag)
			parked, ok := telemetryGauge(t, ms, subscriptions.MetricParked, name)
			require.True(t, ok)
			require.EqualValues(t, 1, parked)

			// Spans: every handle span is the child of a batch span in the
			// same trace and links to the request that appended the event.
			batches := map[trace.SpanID]sdktrace.ReadOnlySpan{}
			for _, s := range kit.spans.Ended() {
				if s.Name() == subscriptions.SpanBatch {
					batches[s.SpanContext().SpanID()] = s
					require.Equal(t, name, spanAttr(s, subscriptions.AttrSubscriber).AsString())
				}
			}
			poisonAttempts := map[int64]codes.Code{}
			okHandled := map[string]bool{}
			for _, s := range kit.spans.Ended() {
				if s.Name() != subscriptions.SpanHandle {
					continue
				}
				parent, ok := batches[s.Parent().SpanID()]
				require.True(t, ok, "handle span without a batch parent")
				require.Equal(t, parent.SpanContext().TraceID(), s.SpanContext().TraceID())
				require.Equal(t, trace.SpanKindConsumer, s.SpanKind())
				require.Len(t, s.Links(), 1)
				require.Equal(t, appended.TraceID(), s.Links()[0].SpanContext.TraceID())
				require.Equal(t, appended.SpanID(), s.Links()[0].SpanContext.SpanID())
				require.True(t, s.Links()[0].SpanContext.IsRemote())
				id := spanAttr(s, subscriptions.AttrEventID).AsString()
				if id == evs[2].ID {
					poisonAttempts[spanAttr(s, subscriptions.AttrAttempt).AsInt64()] = s.Status().Code
					require.NotEmpty(t, s.Events(), "the error is recorded")
					continue
				}
				require.Equal(t, codes.Unset, s.Status().Code)
				okHandled[id] = true
			}
			require.Equal(t, map[int64]codes.Code{1: codes.Error, 2: codes.Error}, poisonAttempts)
			require.Len(t, okHandled, 4)

			// Replay after the fix.
			fixed.Store(true)
			require.NoError(t, sub.ReplayParked(ctx, evs[2].ID))
			ms = kit.collect(t)
			require.EqualValues(t, 1, telemetryCount(t, ms, name, subscriptions.OutcomeReplayed))
			parked, _ = telemetryGauge(t, ms, subscriptions.MetricParked, name)
			require.Zero(t, parked)
			var replays int
			for _, s := range kit.spans.Ended() {
				if s.Name() == subscriptions.SpanReplay {
					replays++
					require.Equal(t, evs[2].ID, spanAttr(s, subscriptions.AttrEventID).AsString())
					require.Len(t, s.Links(), 1)
					require.Equal(t, appended.TraceID(), s.Links()[0].SpanContext.TraceID())
				}
			}
			require.Equal(t, 1, replays)

			// Reset: the gauges show the whole feed waiting, a minute old;
			// once woken, every event is handled again.
			require.NoError(t, sub.ResetCheckpoint(ctx, 0))
			ms = kit.collect(t)
			lag, _ = telemetryGauge(t, ms, subscriptions.MetricLagEvents, name)
			require.EqualValues(t, 5, lag)
			age, ok := telemetryGauge(t, ms, subscriptions.MetricLagAge, name)
			require.True(t, ok)
			require.GreaterOrEqual(t, age, 60.0)
			notifier.Notify()
			waitState(subscriptions.StateIdle, 0)
			ms = kit.collect(t)
			require.EqualValues(t, 9, telemetryCount(t, ms, name, subscriptions.OutcomeHandled))
			age, _ = telemetryGauge(t, ms, subscriptions.MetricLagAge, name)
			require.Zero(t, age)

			// Once Run has returned, the gauges are no longer reported.
			run.stop(t)
			ms = kit.collect(t)
			_, ok = telemetryGauge(t, ms, subscriptions.MetricLagEvents, name)
			require.False(t, ok)
		})
	}
}

// TestTelemetryGauges: the observable instruments report one series per
// subscriber whatever Run is asked twice, and keep reporting (lag 0, as
// Status does) with the checkpoint ahead of the feed head, on every
// backend.
func TestTelemetryGauges(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ctx := context.Background()
			kit := newTelemetryKit(t)
			const name = "tele-gauges"
			sub := coreNewSub(t, name, e.Events, e.Checkpoints, coreNoop,
				append(kit.options(), subscriptions.WithParkingLot(e.Parking), subscriptions.WithPollInterval(5*time.Millisecond))...)
			appendN(t, e.Events, "tele.ok", 0, 2)

			for round := range 2 {
				run := start(t, sub)
				statusWait(t, sub, "caught up", func(st subscriptions.Status) bool {
					return st.State == subscriptions.StateIdle && st.Lag == 0 && st.Position == 2
				})
				require.ErrorIs(t, sub.Run(ctx), subscriptions.ErrRunning, "round %d", round)
				ms := kit.collect(t) // fails on a second series
				for _, m := range []string{subscriptions.MetricLagEvents, subscriptions.MetricLagAge, subscriptions.MetricParked} {
					v, ok := telemetryGauge(t, ms, m, name)
					require.True(t, ok, "round %d: %s reported", round, m)
					require.Zero(t, v, "round %d: %s", round, m)
				}
				run.stop(t)
			}

			run := start(t, sub)
			defer run.stop(t)
			statusWait(t, sub, "running", func(st subscriptions.Status) bool { return st.State == subscriptions.StateIdle })
			require.NoError(t, sub.ResetCheckpoint(ctx, 10))
			_, err := sub.Status(ctx)
			require.ErrorIs(t, err, subscriptions.ErrCheckpointAhead)
			ms := kit.collect(t) // Collect succeeds
			for _, m := range []string{subscriptions.MetricLagEvents, subscriptions.MetricLagAge, subscriptions.MetricParked} {
				v, ok := telemetryGauge(t, ms, m, name)
				require.True(t, ok, "%s reported with the checkpoint ahead", m)
				require.Zero(t, v, m)
			}
		})
	}
}

// TestTelemetryBatchSpans: a batch span is the root of its own trace, not
// a child of the span in Run's context (it links to it); a batch that
// fails on its first event ends before its retries start, and the retry
// batch links to it. On every backend.
func TestTelemetryBatchSpans(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			kit := newTelemetryKit(t)
			var calls atomic.Int32
			handler := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
				if calls.Add(1) == 1 {
					return errors.New("first attempt fails")
				}
				return nil
			}
			const name = "tele-spans"
			sub := coreNewSub(t, name, e.Events, e.Checkpoints, handler,
				append(kit.options(), subscriptions.WithParkingLot(e.Parking), subscriptions.WithMaxRetries(2),
					subscriptions.WithRetryBackoff(50*time.Millisecond, 50*time.Millisecond))...)
			appendN(t, e.Events, "tele.ok", 0, 1)

			runCtx, startup := kit.traces.Tracer("app").Start(context.Background(), "startup")
			startup.End()
			ctx, cancel := context.WithCancel(runCtx)
			done := make(chan error, 1)
			go func() { done <- sub.Run(ctx) }()
			defer func() {
				cancel()
				select {
				case err := <-done:
					require.NoError(t, err)
				case <-time.After(30 * time.Second):
					t.Fatal("Run did not return")
				}
			}()
			waitCaughtUp(t, sub)

			// By attempt: the ordinary batch has none, its retry 2.
			var first, retry sdktrace.ReadOnlySpan
			require.Eventually(t, func() bool {
				for _, s := range kit.spans.Ended() {
					if s.Name() != subscriptions.SpanBatch {
						continue
					}
					switch spanAttr(s, subscriptions.AttrAttempt).AsInt64() {
					case 0:
						first = s
					case 2:
						retry = s
					}
				}
				return first != nil && retry != nil
			}, 30*time.Second, 2*time.Millisecond)
			for _, s := range []sdktrace.ReadOnlySpan{first, retry} {
				require.False(t, s.Parent().IsValid(), "a batch span is a root")
				require.NotEqual(t, startup.SpanContext().TraceID(), s.SpanContext().TraceID())
				require.Equal(t, startup.SpanContext().SpanID(), s.Links()[0].SpanContext.SpanID(), "linked to Run's span")
			}
			require.Equal(t, codes.Error, first.Status().Code)
			require.False(t, first.EndTime().After(retry.StartTime()), "the failed batch ends before its retry starts")
			require.Len(t, retry.Links(), 2)
			require.Equal(t, first.SpanContext().SpanID(), retry.Links()[1].SpanContext.SpanID(), "the retry links to the failed batch")
		})
	}
}

// blockingHeadStore makes HeadPosition wait for its context's end while
// block is set: a database that does not answer.
type blockingHeadStore struct {
	domain.EventStore
	block atomic.Bool
}

func (s *blockingHeadStore) HeadPosition(ctx context.Context) (int64, error) {
	if s.block.Load() {
		<-ctx.Done()
		return 0, ctx.Err()
	}
	return s.EventStore.HeadPosition(ctx)
}

// TestTelemetryGaugeDeadline: a collection whose context has no deadline
// (as the Prometheus exporter's) still returns when the database does not
// answer: the callback's reads run under a deadline of their own. The
// deadline is the store's business, not the backend's: memory only.
func TestTelemetryGaugeDeadline(t *testing.T) {
	t.Parallel()
	e := envBackends()[0].New(t)
	store := &blockingHeadStore{EventStore: e.Events}
	kit := newTelemetryKit(t)
	sub := coreNewSub(t, "tele-deadline", store, e.Checkpoints, coreNoop, kit.options()...)
	start(t, sub)
	statusWait(t, sub, "idle", func(st subscriptions.Status) bool { return st.State == subscriptions.StateIdle })
	store.block.Store(true)
	defer store.block.Store(false)
	collected := make(chan error, 1)
	go func() {
		var rm metricdata.ResourceMetrics
		collected <- kit.reader.Collect(context.Background(), &rm)
	}()
	select {
	case err := <-collected:
		require.ErrorContains(t, err, context.DeadlineExceeded.Error())
		require.ErrorContains(t, err, "tele-deadline")
	case <-time.After(60 * time.Second):
		t.Fatal("the collection did not return: no deadline on the gauges' reads")
	}
}
