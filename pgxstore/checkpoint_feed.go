package pgxstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure/pgevents"
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

// AcquireAfter sends the batch's BEGIN, the row lock, the read of the
// attempt record and the read of the feed after after as one pipelined
// round trip (see beginWith), where reading first and acquiring after
// takes four. When the row is not locked here (held, paused or missing)
// it declines (ok false) and the ordinary path decides. The attempt
// record is read in the batch's transaction once the row is locked, as
// the batch's first HasAttempt would read it (see prefetchedAttempt). The
// batch is acquired without ctx's cancellation, so that shutdown drains
// it.
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
	var (
		locked  lockedRow
		attempt prefetchedAttempt
		events  []domain.EventEnvelope[any]
	)
	tx, err := beginWith(bctx, conn, func(pipe *pgx.Batch) {
		pipe.Queue(lockRow, subscriber, subscriptions.PauseKey(subscriber)).QueryRow(func(row pgx.Row) error {
			return row.Scan(locked.targets()...)
		})
		pipe.Queue(attemptPosition, subscriber).QueryRow(func(row pgx.Row) error {
			var at int64
			switch err := row.Scan(&at); {
			case err == nil:
				attempt = prefetchedAttempt{known: true, exists: true, position: at}
			case errors.Is(err, pgx.ErrNoRows):
				attempt = prefetchedAttempt{known: true}
			default:
				return err
			}
			return nil
		})
		pipe.Queue(selectEvents+read, args...).Query(func(rows pgx.Rows) (err error) {
			events, err = pgevents.ReadEnvelopes(rows, limit)
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
	b := locked.batch(s, subscriber, conn, tx)
	b.attempt = attempt
	return b, events, true, nil
}

// attemptPosition reads the position of the subscriber's attempt record
// ($1).
const attemptPosition = "SELECT position FROM subscriber_attempts WHERE subscriber = $1"

// prefetchedAttempt is the subscriber's attempt record as AcquireAfter
// read it, in the batch's transaction once the row was locked: it answers
// the batch's first HasAttempt without a round trip. It is what that read
// would have returned a moment later: the batch has written nothing since
// (any write through the batch, and the first HandlerContext, drop it),
// and what other transactions commit meanwhile is no more ordered with
// the batch's read than it was. The zero value knows nothing. It belongs
// to the batch's goroutine.
type prefetchedAttempt struct {
	known, exists bool
	position      int64 // the record's position, when exists
}

// take answers HasAttempt at position for the batch's own subscriber
// (own), once: ok is false when the read must run.
func (p *prefetchedAttempt) take(own bool, position int64) (has, ok bool) {
	if !p.known || !own {
		return false, false
	}
	has = p.exists && p.position == position
	*p = prefetchedAttempt{}
	return has, true
}
