package subscriptions_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestTracingEventStoreMetadata: what Append writes into the metadata,
// and what it leaves alone, on every backend (the values must survive the
// database's JSON round trip).
func TestTracingEventStoreMetadata(t *testing.T) {
	t.Parallel()
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			store := subscriptions.NewTracingEventStore(e.Events)
			ctx := context.Background()

			for _, tc := range []struct {
				name     string
				ctx      context.Context
				metadata map[string]any
				want     func(sc trace.SpanContext, got map[string]any)
			}{
				{"no span: metadata as given", ctx, map[string]any{"k": "v"}, func(_ trace.SpanContext, got map[string]any) {
					require.Equal(t, map[string]any{"k": "v"}, got)
				}},
				{"span: traceparent added, other keys kept", nil, map[string]any{"k": "v"}, func(sc trace.SpanContext, got map[string]any) {
					require.Equal(t, "v", got["k"])
					require.Equal(t, "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01", got[subscriptions.MetadataTraceParent])
					require.NotContains(t, got, subscriptions.MetadataTraceState)
				}},
				{"span: a stale traceparent and tracestate replaced", nil, map[string]any{
					subscriptions.MetadataTraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
					subscriptions.MetadataTraceState:  "old=1",
				}, func(sc trace.SpanContext, got map[string]any) {
					require.Equal(t, "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01", got[subscriptions.MetadataTraceParent])
					require.NotContains(t, got, subscriptions.MetadataTraceState)
				}},
			} {
				t.Run(tc.name, func(t *testing.T) {
					actx := tc.ctx
					var span trace.Span
					if actx == nil {
						actx, span = tp.Tracer("test").Start(ctx, "append")
						defer span.End()
					}
					ev := domain.NewEventEnvelope[any](map[string]any{"n": 1}, "trace-agg", "trace.test", 0)
					ev.Metadata = tc.metadata
					given := map[string]any{}
					for k, v := range tc.metadata {
						given[k] = v
					}
					require.NoError(t, store.Append(actx, ev.AggregateID, -1, ev))
					require.Equal(t, given, ev.Metadata, "the caller's metadata map is not modified")
					got, err := e.Events.GetEventByID(ctx, ev.ID)
					require.NoError(t, err)
					tc.want(trace.SpanContextFromContext(actx), got.Metadata)
				})
			}
		})
	}
	require.Nil(t, subscriptions.NewTracingEventStore(nil))
}

// TestDecoratedStoresKeepThePipeline: a subscriber given the decorated
// stores still acquires and reads in one round trip on Postgres.
func TestDecoratedStoresKeepThePipeline(t *testing.T) {
	t.Parallel()
	pg := dbtest.NewPostgres(t)
	e := gormEnv(t, "postgres", pg.DB, pg)
	decorated := subscriptions.NewNotifyingEventStore(subscriptions.NewTracingEventStore(e.Events), func() {})
	for _, store := range []domain.EventStore{e.Events, decorated, subscriptions.NewTracingEventStore(decorated)} {
		sub := coreNewSub(t, "pipe-decorated", store, e.Checkpoints, coreNoop)
		require.True(t, subscriptions.SubscriberPipelinesForTest(sub), "%T", store)
	}
	sub := coreNewSub(t, "pipe-memory", subscriptions.NewTracingEventStore(infrastructure.NewMemoryStore()), e.Checkpoints, coreNoop)
	require.False(t, subscriptions.SubscriberPipelinesForTest(sub))
}
