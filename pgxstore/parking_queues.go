package pgxstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/eventfeed/subscriptions"
)

// This file holds the lot's queues (subscriptions.OrderedParkingLot), with
// the statements subscriptions.GormParkingLot runs on the same table, so
// that either lot keeps the other's queues headed.

var _ subscriptions.OrderedParkingLot = (*ParkingLot)(nil)

// ParkedHeads returns the head of each of the subscriber's queues, through
// the batch transaction in ctx when it is on the lot's database: one
// statement on the partial index of the entries that are not held.
func (l *ParkingLot) ParkedHeads(ctx context.Context, subscriber string) ([]subscriptions.ParkedEvent, error) {
	rows, err := l.querier(ctx).Query(ctx, l.stmt.heads, subscriberKey(subscriber), subscriber)
	if err != nil {
		return nil, fmt.Errorf("pgxstore: read the queues of %q: %w", subscriber, err)
	}
	out, err := pgx.CollectRows(rows, scanParked)
	if err != nil {
		return nil, fmt.Errorf("pgxstore: read the queues of %q: %w", subscriber, err)
	}
	return out, nil
}

// Hold parks held behind the head of its aggregate's queue when that lies
// before it, through the batch transaction as Park, and returns the head's
// event ID; "" when the aggregate has no entry before it, and nothing is
// written. The head is locked FOR KEY SHARE, which a replay's or
// discard's FOR NO KEY UPDATE does not conflict with: a head being
// replayed is still found, and the replay's DELETE then waits for this
// transaction, so that its promotion of the next entry sees this one.
func (l *ParkingLot) Hold(ctx context.Context, held subscriptions.ParkedEvent) (string, error) {
	if err := subscriptions.ValidateParked(held); err != nil {
		return "", fmt.Errorf("pgxstore: %w", err)
	}
	if held.ParkedAt.IsZero() {
		held.ParkedAt = time.Now()
	}
	var head string
	err := l.querier(ctx).QueryRow(ctx, l.stmt.hold, subscriberKey(held.Subscriber), held.Subscriber, storableText(held.AggregateID), held.Position,
		entryKey(held.Subscriber, held.EventID), held.EventID, storableText(held.EventType), storableText(held.Error),
		held.Attempts, held.ParkedAt.UTC()).Scan(&head)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("pgxstore: hold event %q (position %d) for %q: %w", held.EventID, held.Position, held.Subscriber, err)
	}
	return head, nil
}

// CountHeld returns how many of the subscriber's entries are held.
func (l *ParkingLot) CountHeld(ctx context.Context, subscriber string) (int, error) {
	var n int64
	if err := l.pool.QueryRow(ctx, l.stmt.countHeld, subscriberKey(subscriber), subscriber).Scan(&n); err != nil {
		return 0, fmt.Errorf("pgxstore: count held events of %q: %w", subscriber, err)
	}
	return int(n), nil
}

// promote makes the first entry of the subscriber's queue of aggregate its
// head, through q, after an entry of it was removed there. The first entry
// is locked FOR UPDATE: one a concurrent removal deletes is skipped, after
// waiting, for the next.
func (l *ParkingLot) promote(ctx context.Context, q querier, subscriber, aggregate string) error {
	if aggregate == "" {
		return nil
	}
	if _, err := q.Exec(ctx, l.stmt.promote, subscriberKey(subscriber), subscriber, aggregate); err != nil {
		return fmt.Errorf("make the next entry of aggregate %q the head of its queue: %w", aggregate, err)
	}
	return nil
}
