package pgxstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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
// the store's own pool and events table: an event store of another
// tenant's schema on the same pool is not the store's feed.
func (s *CheckpointStore) SharesFeed(events domain.EventStore) bool {
	es, ok := events.(*EventStore)
	return ok && es.pool == s.pool && s.eventsTable != "" && es.table.Qualified() == s.eventsTable
}

// resolveEventsTable returns the events table of schemaName ("" for the
// pool's search_path) as pgevents.TableQuery spells it, which EventStore
// keeps (pgevents.Table.Qualified); "" when there is none.
func resolveEventsTable(ctx context.Context, pool *pgxpool.Pool, schemaName string) (string, error) {
	var table string
	err := pool.QueryRow(ctx, pgevents.TableQuery, pgevents.TableName(schemaName)).Scan(&table)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("resolve the events table: %w", err)
	}
	return table, nil
}

// readFeed runs query, a statement of the store's feed (checkpointSQL's
// feedAt or feedRange), through q and decodes its events.
func readFeed(ctx context.Context, q querier, query string, args ...any) ([]domain.EventEnvelope[any], error) {
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgevents.ScanEnvelopes(rows)
}

// ReadPositions reads the events at positions in the batch's transaction,
// for a feed the store shares: a partition's events after its lock, on
// the batch's connection.
func (b *batch) ReadPositions(ctx context.Context, positions []int64) ([]domain.EventEnvelope[any], error) {
	if b.tx == nil {
		return nil, fmt.Errorf("pgxstore: read the feed in the batch of %q: the batch has no transaction", b.subscriber)
	}
	if len(positions) == 0 {
		return []domain.EventEnvelope[any]{}, nil
	}
	// One bigint[] literal, as EventStore.ReadPositions passes it: one
	// statement text whatever the number of positions.
	events, err := readFeed(ctx, b.tx, b.store.stmt.feedAt, pgevents.PositionsArray(positions))
	if err != nil {
		return nil, fmt.Errorf("pgxstore: read %d events at positions %d... in the batch of %q: %w", len(positions), positions[0], b.subscriber, err)
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
	read, args := s.stmt.feedAfter, []any{after}
	if limit > 0 {
		read, args = s.stmt.feedAfterLimit, append(args, limit)
	}
	var (
		locked  lockedRow
		attempt prefetchedAttempt
		events  []domain.EventEnvelope[any]
	)
	tx, err := beginWith(bctx, conn, func(pipe *pgx.Batch) {
		pipe.Queue(s.stmt.lockRow, subscriber, subscriptions.PauseKey(subscriber)).QueryRow(func(row pgx.Row) error {
			return row.Scan(locked.targets()...)
		})
		pipe.Queue(s.stmt.attemptPosition, subscriber).QueryRow(func(row pgx.Row) error {
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
		pipe.Queue(read, args...).Query(func(rows pgx.Rows) (err error) {
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
