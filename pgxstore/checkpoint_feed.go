package pgxstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

// This file holds what a CheckpointStore does with an EventStore on its
// own pool: its batches read the feed in their transaction
// (subscriptions.BatchFeedReader), and a batch is acquired together with
// the read of the feed past it (subscriptions.FeedAcquirer).

var (
	_ subscriptions.FeedAcquirer    = (*CheckpointStore)(nil)
	_ subscriptions.BatchFeedReader = (*batch)(nil)
)

// SharesFeed reports whether events is an EventStore of this package on
// the store's own pool.
func (s *CheckpointStore) SharesFeed(events domain.EventStore) bool {
	es, ok := events.(*EventStore)
	return ok && es.pool == s.pool
}

// ReadPositions reads the events at positions in the batch's transaction,
// for a feed the store shares: a partition's events after its lock, on
// the batch's connection.
func (b *batch) ReadPositions(ctx context.Context, positions []int64) ([]domain.EventEnvelope[any], error) {
	if b.tx == nil {
		return nil, fmt.Errorf("pgxstore: read the feed in the batch of %q: the batch has no transaction", b.subscriber)
	}
	events, err := readPositions(ctx, b.tx, positions)
	if err != nil {
		return nil, fmt.Errorf("in the batch of %q: %w", b.subscriber, err)
	}
	return events, nil
}

// AcquireAfter sends the batch's BEGIN, the row lock and the read of the
// feed after after as one pipelined round trip (see beginWith), where
// reading first and acquiring after takes three. When the row is not
// locked here (held, paused or missing) it declines (ok false) and the
// ordinary path decides. The batch is acquired without ctx's
// cancellation, so that shutdown drains it.
func (s *CheckpointStore) AcquireAfter(ctx context.Context, subscriber string, after int64, limit int) (subscriptions.Batch, []domain.EventEnvelope[any], bool, error) {
	if err := subscriptions.CheckSubscriberName(subscriber); err != nil {
		return nil, nil, false, fmt.Errorf("pgxstore: acquire: %w", err)
	}
	bctx := context.WithoutCancel(ctx)
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, false, fmt.Errorf("pgxstore: acquire checkpoint of %q: connection: %w", subscriber, err)
	}
	read := "WHERE position > $1 ORDER BY position"
	args := []any{after}
	if limit > 0 {
		read += " LIMIT $2"
		args = append(args, limit)
	}
	var locked lockedRow
	var events []domain.EventEnvelope[any]
	tx, err := beginWith(bctx, conn, func(pipe *pgx.Batch) {
		pipe.Queue(lockRow, subscriber, subscriptions.PauseKey(subscriber)).QueryRow(func(row pgx.Row) error {
			return row.Scan(locked.targets()...)
		})
		pipe.Queue(selectEvents+read, args...).Query(func(rows pgx.Rows) (err error) {
			events, err = collectEvents(rows)
			return err
		})
	})
	if err != nil {
		return nil, nil, false, fmt.Errorf("pgxstore: acquire checkpoint of %q and read the feed after %d: %w", subscriber, after, err)
	}
	if locked.position == nil || locked.paused {
		endTx(tx, conn)
		return nil, nil, false, nil
	}
	return locked.batch(s, subscriber, conn, tx), events, true, nil
}
