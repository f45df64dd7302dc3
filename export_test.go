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
	return g.dialect.Pipelines && g.SharesFeed(events)
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
func SubscriberPipelinesForTest(sub *Subscriber) bool {
	_, ok := sub.acquirer.(feedAcquirer)
	return ok
}

// SQLiteRegistryCountForTest is the number of SQLite pools with a batch
// registry.
func SQLiteRegistryCountForTest() int { return sqliteRegistryCount() }

// AttemptsForTest reads the attempt count that store keeps for
// subscriber's checkpoint (0 when there is no record, or it is void: its
// position is not the checkpoint's).
func AttemptsForTest(ctx context.Context, store CheckpointStore, subscriber string) (int, error) {
	position, err := store.Position(ctx, subscriber)
	if err != nil {
		return 0, err
	}
	var rec AttemptRecord
	var found bool
	switch s := store.(type) {
	case *MemoryCheckpointStore:
		s.attempts.mu.Lock()
		rec, found = s.attempts.records[subscriber]
		s.attempts.mu.Unlock()
	case *GormCheckpointStore:
		var rows []attemptRow
		if err := s.db.WithContext(ctx).Raw("SELECT position, event_id, through, attempts, last_error FROM subscriber_attempts WHERE subscriber = ?", subscriber).Scan(&rows).Error; err != nil {
			return 0, err
		}
		if len(rows) == 1 {
			rec, found = AttemptRecord{Position: rows[0].Position, Attempts: rows[0].Attempts}, true
		}
	default:
		return 0, errors.ErrUnsupported
	}
	if !found || rec.Position != position {
		return 0, nil
	}
	return rec.Attempts, nil
}
