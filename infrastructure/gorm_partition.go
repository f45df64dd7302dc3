package infrastructure

import (
	"context"
	"fmt"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/partition"
)

// The reads of one partition of the feed (subscriptions.PartitionFeed) and
// of the feed's aggregates by position (subscriptions.FeedIndex), for
// partitioned subscribers: on Postgres the partition filter runs in SQL
// (dialect.PartitionHash, the same hash as subscriptions.PartitionOf);
// SQLite has no MD5, so there the feed is read in chunks and filtered in
// Go (internal/partition). Every read keeps ReadAfter's rule: no position
// is returned while a smaller one can still commit.

// ReadPartitionAfter returns up to limit events (all when limit <= 0) of
// partition p of n (subscriptions.PartitionOf) with Position >
// afterPosition, in position order.
func (s *GormEventStore) ReadPartitionAfter(ctx context.Context, afterPosition int64, limit, p, n int) ([]domain.EventEnvelope[any], error) {
	hash := s.dialect.PartitionHash()
	if hash == "" {
		return partition.ReadAfter(ctx, s.ReadAfter, afterPosition, limit, p, n)
	}
	sqlLimit := int64(limit)
	if limit <= 0 {
		sqlLimit = 1<<63 - 1
	}
	return s.query(ctx, fmt.Sprintf("read partition %d of %d after position %d", p, n, afterPosition), max(limit, 0),
		"WHERE position > ? AND mod("+hash+", ?) = ? ORDER BY position LIMIT ?", afterPosition, n, p, sqlLimit)
}

// CountPartitionAfter counts the events of partition p of n in (after,
// head].
func (s *GormEventStore) CountPartitionAfter(ctx context.Context, after, head int64, p, n int) (int64, error) {
	hash := s.dialect.PartitionHash()
	if hash == "" {
		return partition.CountAfter(ctx, s.ReadAfter, after, head, p, n)
	}
	var count int64
	if err := s.db.WithContext(ctx).Raw("SELECT count(*) FROM "+s.events+" WHERE position > ? AND position <= ? AND mod("+hash+", ?) = ?",
		after, head, n, p).Scan(&count).Error; err != nil {
		return 0, fmt.Errorf("count partition %d of %d after position %d: %w", p, n, after, err)
	}
	return count, nil
}

// ReadAggregatesAfter returns the positions and aggregate IDs of up to
// limit events past afterPosition, in position order: the feed without
// payloads, which a partitioned subscriber hashes to know which partition
// each position belongs to.
func (s *GormEventStore) ReadAggregatesAfter(ctx context.Context, afterPosition int64, limit int) ([]int64, []string, error) {
	var rows []struct {
		Position    int64
		AggregateID string
	}
	if err := s.db.WithContext(ctx).Raw("SELECT position, aggregate_id FROM "+s.events+" WHERE position > ? ORDER BY position LIMIT ?",
		afterPosition, limit).Scan(&rows).Error; err != nil {
		return nil, nil, fmt.Errorf("read the feed's aggregates after position %d: %w", afterPosition, err)
	}
	positions, aggregates := make([]int64, len(rows)), make([]string, len(rows))
	for i, r := range rows {
		positions[i], aggregates[i] = r.Position, r.AggregateID
	}
	return positions, aggregates, nil
}

// ReadPositions returns the events at positions, in position order; a
// position without an event is left out.
func (s *GormEventStore) ReadPositions(ctx context.Context, positions []int64) ([]domain.EventEnvelope[any], error) {
	if len(positions) == 0 {
		return []domain.EventEnvelope[any]{}, nil
	}
	where, args := s.dialect.PositionIn(positions)
	return s.query(ctx, fmt.Sprintf("read %d events at positions %d...", len(positions), positions[0]), len(positions),
		"WHERE "+where+" ORDER BY position", args...)
}
