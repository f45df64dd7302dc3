package subscriptions

import (
	"context"
	"errors"

	"github.com/eventfeed/subscriptions/domain"
)

// AcquireAndReadForTest exposes the pipelined acquisition to the tests.
func AcquireAndReadForTest(ctx context.Context, g *GormCheckpointStore, subscriber string, after int64, limit int) (Batch, []domain.EventEnvelope[any], error) {
	return g.acquireAndRead(ctx, subscriber, after, limit)
}

// PipelinesForTest reports whether g pipelines acquisition for events.
func PipelinesForTest(g *GormCheckpointStore, events domain.EventStore) bool {
	return g.pipelines(events)
}

// IsNoPipeline reports the "take the ordinary path" answer.
func IsNoPipeline(err error) bool { return errors.Is(err, errNoPipeline) }

// WithoutTelemetryForTest removes the subscriber's instrumentation
// entirely: the baseline of the telemetry benchmarks.
func WithoutTelemetryForTest() SubscriberOption {
	return func(s *Subscriber) { s.noTelemetry = true }
}

// SubscriberPipelinesForTest reports whether sub acquires and reads in one
// round trip.
func SubscriberPipelinesForTest(sub *Subscriber) bool { return sub.pipelined != nil }

// SQLiteRegistryCountForTest is the number of SQLite pools with a batch
// registry.
func SQLiteRegistryCountForTest() int { return sqliteRegistryCount() }
