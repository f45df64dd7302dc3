package subscriptions

import (
	"context"
	"fmt"

	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/dialect"
	"github.com/eventfeed/subscriptions/internal/eventrow"
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
	// pg is the database of a GormEventStore on Postgres, nil otherwise.
	pg *gorm.DB
	// index, set by a partitioned Run on Postgres, names the partition's
	// positions, so that ReadAfter reads them alone (partitionIndex).
	index *partitionIndex
}

func newPartitionFeed(events domain.EventStore, partition, partitions int) *partitionFeed {
	f := &partitionFeed{EventStore: events, partition: partition, partitions: partitions}
	// The filter in SQL needs the engine to compute PartitionOf's hash
	// (and bigint arrays, for the index): Postgres.
	if db, ok := eventrow.StoreDB(undecorated(events)); ok {
		if d := dialect.Of(db); d != nil && d.PartitionHash() != "" {
			f.pg = db
		}
	}
	return f
}

// partitionFeedClause reads the partition's events by the hash filter
// (after eventrow.Select).
const partitionFeedClause = `WHERE position > ? AND mod(` + partitionHashSQL + `, ?) = ? ORDER BY position LIMIT ?`

// partitionPositionsClause reads the events at the positions of a
// bigint[] literal (positionsArray), after eventrow.Select.
const partitionPositionsClause = `WHERE position = ANY(?::bigint[]) ORDER BY position`

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
		return f.readRows(ctx, afterPosition, partitionFeedClause, afterPosition, f.partitions, f.partition, sqlLimit)
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
	events, err = f.readRows(ctx, afterPosition, partitionPositionsClause, positionsArray(positions))
	if err != nil {
		return nil, false, err
	}
	return events, len(events) == len(positions), nil
}

// readRows runs a read of the partition's events (clause after
// eventrow.Select) and decodes them.
func (f *partitionFeed) readRows(ctx context.Context, afterPosition int64, clause string, args ...any) ([]domain.EventEnvelope[any], error) {
	events, err := eventrow.Read(ctx, f.pg, clause, args...)
	if err != nil {
		return nil, fmt.Errorf("read partition %d of %d after position %d: %w", f.partition, f.partitions, afterPosition, err)
	}
	return events, nil
}

// countAfter counts the partition's events in (after, head].
func (f *partitionFeed) countAfter(ctx context.Context, after, head int64) (int64, error) {
	if f.pg != nil {
		var n int64
		err := f.pg.WithContext(ctx).Raw(`SELECT count(*) FROM events WHERE position > ? AND position <= ? AND mod(`+partitionHashSQL+`, ?) = ?`,
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

// indexedAcquirer is a partition's acquirer when its feed has an index
// (Postgres): it looks the partition's positions up in the index, acquires
// the checkpoint only when there are some, and reads those events in the
// batch's transaction. A partition another replica holds then costs the
// lock attempt alone, not a read of its events (with several processes,
// most attempts at a partition held elsewhere ended that way). The index
// answering nothing takes fallback, the ordinary read then acquire. It is
// used only with a GormCheckpointStore on the events' own database
// (partitionChild).
type indexedAcquirer struct {
	feed        *partitionFeed
	checkpoints CheckpointStore
	fallback    acquirer
}

func (a indexedAcquirer) acquireAfter(ctx context.Context, subscriber string, after int64, limit int, expectWork bool) (Batch, []domain.EventEnvelope[any], error) {
	f := a.feed
	positions, ok, err := f.index.positionsAfter(ctx, f.partition, after, limit)
	if err != nil {
		return nil, nil, &feedReadError{err: fmt.Errorf("read partition %d of %d after position %d: %w", f.partition, f.partitions, after, err)}
	}
	if !ok {
		return a.fallback.acquireAfter(ctx, subscriber, after, limit, expectWork)
	}
	if len(positions) == 0 {
		return nil, nil, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, &feedReadError{err: err}
	}
	acquire := a.checkpoints.Acquire
	if g, ok := a.checkpoints.(*GormCheckpointStore); ok {
		acquire = g.acquireLockAndCheck // a skipped lock costs no second read
	}
	batch, acquired, err := acquire(context.WithoutCancel(ctx), subscriber)
	if err != nil {
		return nil, nil, err
	}
	if !acquired {
		return nil, nil, errCheckpointHeld
	}
	gb, ok := batch.(*gormBatch)
	if !ok {
		if err := batch.Rollback(); err != nil {
			return nil, nil, err
		}
		return a.fallback.acquireAfter(ctx, subscriber, after, limit, expectWork)
	}
	events, err := eventrow.Read(context.WithoutCancel(ctx), gb.tx, partitionPositionsClause, positionsArray(positions))
	if err != nil {
		_ = batch.Rollback() // the read's failure is the one to report
		return nil, nil, &feedReadError{err: fmt.Errorf("read partition %d of %d after position %d: %w", f.partition, f.partitions, after, err)}
	}
	if len(events) != len(positions) {
		// An event the index named is gone: read with the hash filter.
		if err := batch.Rollback(); err != nil {
			return nil, nil, err
		}
		return a.fallback.acquireAfter(ctx, subscriber, after, limit, expectWork)
	}
	return batch, events, nil
}
