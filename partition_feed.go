package subscriptions

import (
	"context"
	"fmt"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dialect"
)

// partitionFeed is the view of an event store that one partition reads:
// ReadAfter returns only the events whose aggregate falls in the
// partition (PartitionOf), in feed order. The other methods are the
// store's. A partition's runner is the ordinary per-name runner over this
// view, so the batch, retry and park steps are the unpartitioned ones.
//
// On a Postgres GormEventStore the filter runs in SQL: in a partitioned
// Run, by the positions its partitionIndex names (one index lookup per
// event of the partition), else by the hash filter (which walks the
// position index past every other partition's events); on other stores
// the view reads the feed in chunks and filters in Go (SQLite and memory
// are one process, where reading is cheap next to the write lock).
//
// A partitionFeed is safe for concurrent use, as its store is.
type partitionFeed struct {
	domain.EventStore
	partition, partitions int
	// pg is set when the store is a GormEventStore on Postgres.
	pg *infrastructure.GormEventStore
	// index, set by a partitioned Run on Postgres, names the partition's
	// positions, so that ReadAfter reads them alone (partitionIndex).
	index *partitionIndex
}

func newPartitionFeed(events domain.EventStore, partition, partitions int) *partitionFeed {
	f := &partitionFeed{EventStore: events, partition: partition, partitions: partitions}
	if store, ok := undecorated(events).(*infrastructure.GormEventStore); ok && dialect.Of(store.DB()) == dialect.Postgres {
		f.pg = store
	}
	return f
}

const partitionFeedQuery = `SELECT id, aggregate_id, event_type, sequence_no, transaction_id, position, payload, metadata, created_at
	FROM events WHERE position > ? AND mod(` + partitionHashSQL + `, ?) = ? ORDER BY position LIMIT ?`

// partitionPositionsQuery reads the events at the positions of a bigint[]
// literal (positionsArray).
const partitionPositionsQuery = `SELECT id, aggregate_id, event_type, sequence_no, transaction_id, position, payload, metadata, created_at
	FROM events WHERE position = ANY(?::bigint[]) ORDER BY position`

// partitionReadChunk bounds one read of the unfiltered feed on stores that
// filter in Go.
const partitionReadChunk = 1000

// ReadAfter returns up to limit events of the partition past afterPosition
// (limit <= 0: all). Positions are the store's, so the partition's
// checkpoint is a feed position like any other, and the store's rule that
// no position is returned while a smaller one can still commit holds for
// the view too.
func (f *partitionFeed) ReadAfter(ctx context.Context, afterPosition int64, limit int) ([]domain.EventEnvelope[any], error) {
	if f.pg != nil {
		if f.index != nil {
			events, ok, err := f.readIndexed(ctx, afterPosition, limit)
			if ok || err != nil {
				return events, err
			}
		}
		sqlLimit := int64(limit)
		if limit <= 0 {
			sqlLimit = 1<<63 - 1
		}
		return f.readRows(ctx, afterPosition, partitionFeedQuery, afterPosition, f.partitions, f.partition, sqlLimit)
	}
	out := []domain.EventEnvelope[any]{}
	cursor := afterPosition
	for {
		chunk, err := f.EventStore.ReadAfter(ctx, cursor, partitionReadChunk)
		if err != nil {
			return nil, err
		}
		for _, ev := range chunk {
			if PartitionOf(ev.AggregateID, f.partitions) == f.partition {
				out = append(out, ev)
				if limit > 0 && len(out) == limit {
					return out, nil
				}
			}
		}
		if len(chunk) < partitionReadChunk {
			return out, nil
		}
		cursor = chunk[len(chunk)-1].Position
	}
}

// readIndexed reads the partition's events past afterPosition at the
// positions its index names. ok is false when the index cannot answer (the
// checkpoint is behind its window) or a named event is missing: the caller
// then reads with the hash filter.
func (f *partitionFeed) readIndexed(ctx context.Context, afterPosition int64, limit int) (events []domain.EventEnvelope[any], ok bool, err error) {
	positions, ok, err := f.index.positionsAfter(ctx, f.partition, afterPosition, limit)
	if err != nil {
		return nil, false, fmt.Errorf("read partition %d of %d after position %d: %w", f.partition, f.partitions, afterPosition, err)
	}
	if !ok {
		return nil, false, nil
	}
	if len(positions) == 0 {
		return []domain.EventEnvelope[any]{}, true, nil
	}
	events, err = f.readRows(ctx, afterPosition, partitionPositionsQuery, positionsArray(positions))
	if err != nil {
		return nil, false, err
	}
	return events, len(events) == len(positions), nil
}

// readRows runs a read of the partition's events and decodes them.
func (f *partitionFeed) readRows(ctx context.Context, afterPosition int64, query string, args ...any) ([]domain.EventEnvelope[any], error) {
	var rows []infrastructure.GormEventModel
	if err := f.pg.DB().WithContext(ctx).Raw(query, args...).Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("read partition %d of %d after position %d: %w", f.partition, f.partitions, afterPosition, err)
	}
	out := make([]domain.EventEnvelope[any], 0, len(rows))
	for i := range rows {
		ev, err := rows[i].Envelope()
		if err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	return out, nil
}

// countAfter counts the partition's events in (after, head].
func (f *partitionFeed) countAfter(ctx context.Context, after, head int64) (int64, error) {
	if f.pg != nil {
		var n int64
		err := f.pg.DB().WithContext(ctx).Raw(`SELECT count(*) FROM events WHERE position > ? AND position <= ? AND mod(`+partitionHashSQL+`, ?) = ?`,
			after, head, f.partitions, f.partition).Scan(&n).Error
		if err != nil {
			return 0, fmt.Errorf("count events after position %d: %w", after, err)
		}
		return n, nil
	}
	var n int64
	cursor := after
	for cursor < head {
		chunk, err := f.EventStore.ReadAfter(ctx, cursor, partitionReadChunk)
		if err != nil {
			return 0, err
		}
		for _, ev := range chunk {
			if ev.Position <= head && PartitionOf(ev.AggregateID, f.partitions) == f.partition {
				n++
			}
		}
		if len(chunk) < partitionReadChunk {
			break
		}
		cursor = chunk[len(chunk)-1].Position
	}
	return n, nil
}
