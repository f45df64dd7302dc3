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

// heldByColumn is the select-list expression of ParkedEvent.HeldBy over
// parked_events AS p: the event ID of the queue's head (its first entry,
// never held) for a held entry, empty for others.
const heldByColumn = `CASE WHEN p.held_by = '' THEN '' ELSE COALESCE((SELECT h.event_id FROM parked_events h
	WHERE h.subscriber_key = p.subscriber_key AND h.subscriber = p.subscriber AND h.aggregate_id = p.aggregate_id AND h.held_by = ''
	ORDER BY h.position, h.event_id LIMIT 1), '') END`

// ParkedHeads returns the head of each of the subscriber's queues, through
// the batch transaction in ctx when it is on the lot's database: one
// statement on the partial index of the entries that are not held.
func (l *ParkingLot) ParkedHeads(ctx context.Context, subscriber string) ([]subscriptions.ParkedEvent, error) {
	rows, err := l.querier(ctx).Query(ctx, `SELECT DISTINCT ON (aggregate_id) `+parkedColumns+`, '' FROM parked_events p
		WHERE `+bySubscriber+` AND held_by = '' AND aggregate_id <> '' ORDER BY aggregate_id, position, event_id`,
		subscriberKey(subscriber), subscriber)
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
	err := l.querier(ctx).QueryRow(ctx, `WITH head AS (SELECT event_id FROM parked_events
			WHERE `+bySubscriber+` AND aggregate_id = $3 AND held_by = '' AND position < $4
			ORDER BY position, event_id LIMIT 1 FOR KEY SHARE)
		INSERT INTO parked_events (key, subscriber_key, subscriber, event_id, event_type, position, error, attempts, parked_at, aggregate_id, held_by)
		SELECT $5, $1, $2, $6::text, $7::text, $4, $8::text, $9::integer, $10::timestamptz, $3, head.event_id FROM head
		ON CONFLICT (key) DO UPDATE SET event_type = excluded.event_type, position = excluded.position,
			error = excluded.error, attempts = excluded.attempts, parked_at = excluded.parked_at,
			aggregate_id = excluded.aggregate_id, held_by = excluded.held_by
		RETURNING held_by`,
		subscriberKey(held.Subscriber), held.Subscriber, storableText(held.AggregateID), held.Position,
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
	if err := l.pool.QueryRow(ctx, `SELECT COUNT(*) FROM parked_events WHERE `+bySubscriber+` AND held_by <> ''`,
		subscriberKey(subscriber), subscriber).Scan(&n); err != nil {
		return 0, fmt.Errorf("pgxstore: count held events of %q: %w", subscriber, err)
	}
	return int(n), nil
}

// deleteKeepingHeads is the statement that deletes the subscriber's rows
// matching where ($1 and $2 are subscriberKey and the name, as in
// bySubscriber) and, of each queue it deletes from, makes the first
// entry it leaves the head, in one statement.
func deleteKeepingHeads(where string) string {
	return `WITH d AS (DELETE FROM parked_events WHERE ` + bySubscriber + ` AND ` + where + ` RETURNING key, aggregate_id)
		UPDATE parked_events p SET held_by = '' WHERE p.subscriber_key = $1 AND p.subscriber = $2
			AND p.held_by <> '' AND p.aggregate_id IN (SELECT aggregate_id FROM d WHERE aggregate_id <> '')
			AND NOT EXISTS (SELECT 1 FROM parked_events q WHERE q.subscriber_key = p.subscriber_key AND q.subscriber = p.subscriber
				AND q.aggregate_id = p.aggregate_id AND (q.position, q.event_id) < (p.position, p.event_id)
				AND q.key NOT IN (SELECT key FROM d))`
}

// promote makes the first entry of the subscriber's queue of aggregate its
// head, through q, after an entry of it was removed there. The first entry
// is locked FOR UPDATE: one a concurrent removal deletes is skipped, after
// waiting, for the next.
func promote(ctx context.Context, q querier, subscriber, aggregate string) error {
	if aggregate == "" {
		return nil
	}
	if _, err := q.Exec(ctx, `UPDATE parked_events SET held_by = '' WHERE key IN (SELECT key FROM parked_events
		WHERE `+bySubscriber+` AND aggregate_id = $3 ORDER BY position, event_id LIMIT 1 FOR UPDATE) AND held_by <> ''`,
		subscriberKey(subscriber), subscriber, aggregate); err != nil {
		return fmt.Errorf("make the next entry of aggregate %q the head of its queue: %w", aggregate, err)
	}
	return nil
}
