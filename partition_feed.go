package subscriptions

import (
	"context"
	"fmt"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/partition"
)

// PartitionFeed is the optional capability of an event store that reads
// one partition of its feed (PartitionOf) in its own query language: on
// Postgres infrastructure.GormEventStore filters with the same hash in
// SQL. A partitioned subscriber reads each partition's events and counts
// its lag through it; without it, it reads the whole feed in chunks and
// keeps the partition's events (cheap in one process, as in memory; on a
// server every partition would read every event).
//
// Both methods keep ReadAfter's rule: no position is returned (or
// counted) while a smaller one can still commit. They are safe for
// concurrent use, as the store is.
type PartitionFeed interface {
	// ReadPartitionAfter returns up to limit events (all when limit <= 0)
	// of partition p of n with Position > afterPosition, in position order.
	ReadPartitionAfter(ctx context.Context, afterPosition int64, limit, p, n int) ([]domain.EventEnvelope[any], error)
	// CountPartitionAfter counts the events of partition p of n in
	// (after, head].
	CountPartitionAfter(ctx context.Context, after, head int64, p, n int) (int64, error)
}

// FeedIndex is the optional capability of an event store that reads its
// feed's positions and aggregate IDs without the payloads, and events by
// position. With it a partitioned Run keeps one index of the recent feed
// (which partition each position is in, hashed in Go once for all
// partitions) and each partition's batch reads its own events by position
// (an index lookup per event) instead of filtering the feed (on Postgres
// the hash filter walks past every other partition's events: at 16
// partitions a read of 100 events visits about 1,600 rows). Without it
// every read filters (PartitionFeed, or in Go).
type FeedIndex interface {
	// ReadAggregatesAfter returns the positions and aggregate IDs of up
	// to limit events past afterPosition, in position order, with
	// ReadAfter's rule.
	ReadAggregatesAfter(ctx context.Context, afterPosition int64, limit int) (positions []int64, aggregateIDs []string, err error)
	// ReadPositions returns the events at positions, in position order; a
	// position without an event is left out.
	ReadPositions(ctx context.Context, positions []int64) ([]domain.EventEnvelope[any], error)
}

// BatchFeedReader is the optional capability of a Batch that reads events
// of the subscriber's feed by position inside its own transaction, when
// its CheckpointStore shares the feed's database (FeedSharer). A
// partitioned subscriber with a feed index then acquires a partition
// first and reads its events after, on the batch's connection: a
// partition another replica holds costs the lock attempt alone, not a
// read, and the batch never needs a second connection. Without it a
// partition reads first and acquires after, as an unpartitioned
// subscriber does.
type BatchFeedReader interface {
	// ReadPositions returns the events at positions, in position order, a
	// missing one left out, read in the batch's transaction.
	ReadPositions(ctx context.Context, positions []int64) ([]domain.EventEnvelope[any], error)
}

// FeedSharer is the optional capability of a CheckpointStore whose
// batches can read an event store's feed in their own transaction: when
// SharesFeed(events) is true, its batches implement BatchFeedReader for
// that feed and, if it is a FeedAcquirer, AcquireAfter reads that feed.
type FeedSharer interface {
	// SharesFeed reports whether events (an event store, without this
	// package's decorators) is read through the store's own database.
	SharesFeed(events domain.EventStore) bool
}

// partitionFeed is the view of an event store that one partition reads:
// ReadAfter returns only the events whose aggregate falls in the
// partition (PartitionOf), in feed order. The other methods are the
// store's. A partition's runner is the ordinary per-name runner over this
// view, so the batch, retry and park steps are the unpartitioned ones.
//
// It reads through the store's PartitionFeed when it has one, else the
// whole feed in chunks filtered in Go; in a partitioned Run whose store is
// a FeedIndex, by the positions its partitionIndex names.
//
// A partitionFeed is safe for concurrent use, as its store is.
type partitionFeed struct {
	domain.EventStore
	partition, partitions int
	// filter is the store's PartitionFeed (under this package's
	// decorators), nil without one.
	filter PartitionFeed
	// index, set by a partitioned Run on a FeedIndex, names the
	// partition's positions, so that ReadAfter reads them alone
	// (partitionIndex).
	index *partitionIndex
}

func newPartitionFeed(events domain.EventStore, partition, partitions int) *partitionFeed {
	f := &partitionFeed{EventStore: events, partition: partition, partitions: partitions}
	f.filter, _ = undecorated(events).(PartitionFeed)
	return f
}

// ReadAfter returns up to limit events of the partition past afterPosition
// (limit <= 0: all). Positions are the store's, so the partition's
// checkpoint is a feed position like any other, and the store's rule that
// no position is returned while a smaller one can still commit holds for
// the view too.
func (f *partitionFeed) ReadAfter(ctx context.Context, afterPosition int64, limit int) ([]domain.EventEnvelope[any], error) {
	if f.index != nil {
		events, ok, err := f.readIndexed(ctx, afterPosition, limit)
		if ok || err != nil {
			return events, err
		}
	}
	var events []domain.EventEnvelope[any]
	var err error
	if f.filter != nil {
		events, err = f.filter.ReadPartitionAfter(ctx, afterPosition, limit, f.partition, f.partitions)
	} else {
		events, err = partition.ReadAfter(ctx, f.EventStore.ReadAfter, afterPosition, limit, f.partition, f.partitions)
	}
	if err != nil {
		return nil, fmt.Errorf("read partition %d of %d after position %d: %w", f.partition, f.partitions, afterPosition, err)
	}
	return events, nil
}

// readIndexed reads the partition's events past afterPosition at the
// positions its index names. ok is false when the index cannot answer (the
// checkpoint is behind its window) or a named event is missing: the caller
// then reads with the filter.
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
	events, err = f.index.feed.ReadPositions(ctx, positions)
	if err != nil {
		return nil, false, fmt.Errorf("read partition %d of %d after position %d: %w", f.partition, f.partitions, afterPosition, err)
	}
	return events, len(events) == len(positions), nil
}

// countAfter counts the partition's events in (after, head].
func (f *partitionFeed) countAfter(ctx context.Context, after, head int64) (int64, error) {
	var n int64
	var err error
	if f.filter != nil {
		n, err = f.filter.CountPartitionAfter(ctx, after, head, f.partition, f.partitions)
	} else {
		n, err = partition.CountAfter(ctx, f.EventStore.ReadAfter, after, head, f.partition, f.partitions)
	}
	if err != nil {
		return 0, fmt.Errorf("count events after position %d: %w", after, err)
	}
	return n, nil
}

// indexedAcquirer is a partition's acquirer when its feed has an index
// and its checkpoint store's batches read that feed (BatchFeedReader): it
// looks the partition's positions up in the index, acquires the
// checkpoint only when there are some, and reads those events in the
// batch's transaction. A partition another replica holds then costs the
// lock attempt alone, not a read of its events (with several processes,
// most attempts at a partition held elsewhere ended that way). The index
// answering nothing takes fallback, the ordinary read then acquire.
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
	batch, acquired, err := a.checkpoints.Acquire(context.WithoutCancel(ctx), subscriber)
	if err != nil {
		return nil, nil, err
	}
	if !acquired {
		return nil, nil, errCheckpointHeld
	}
	reader, ok := batch.(BatchFeedReader)
	if !ok {
		if err := batch.Rollback(); err != nil {
			return nil, nil, err
		}
		return a.fallback.acquireAfter(ctx, subscriber, after, limit, expectWork)
	}
	events, err := reader.ReadPositions(context.WithoutCancel(ctx), positions)
	if err != nil {
		_ = batch.Rollback() // the read's failure is the one to report
		return nil, nil, &feedReadError{err: fmt.Errorf("read partition %d of %d after position %d: %w", f.partition, f.partitions, after, err)}
	}
	if len(events) != len(positions) {
		// An event the index named is gone: read with the filter.
		if err := batch.Rollback(); err != nil {
			return nil, nil, err
		}
		return a.fallback.acquireAfter(ctx, subscriber, after, limit, expectWork)
	}
	return batch, events, nil
}
