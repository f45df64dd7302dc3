package pgxstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/eventfeed/subscriptions"
)

// parkedColumns are the columns scanParked reads, but for the last, the
// held_by it reads (the head's event ID, see newParkingSQL, or the column
// itself). A table taken
// over from the original module (migration 00001) keeps its nullable
// columns, so NULLs read as the zero values subscriptions.GormParkingLot
// gives them.
const parkedColumns = `subscriber, event_id, COALESCE(event_type, ''), COALESCE(position, 0), COALESCE(error, ''),
	COALESCE(attempts, 0), parked_at, aggregate_id`

// scanParked reads one row of parkedColumns and a held_by.
func scanParked(row pgx.CollectableRow) (subscriptions.ParkedEvent, error) {
	var p subscriptions.ParkedEvent
	var at *time.Time
	if err := row.Scan(&p.Subscriber, &p.EventID, &p.EventType, &p.Position, &p.Error, &p.Attempts, &at, &p.AggregateID, &p.HeldBy); err != nil {
		return subscriptions.ParkedEvent{}, err
	}
	if at != nil {
		p.ParkedAt = at.UTC()
	}
	return p, nil
}

// selectParked is the one query behind List and ListFiltered: the
// subscriber's rows through its index, filtered, in position order.
func (l *ParkingLot) selectParked(ctx context.Context, subscriber string, filter subscriptions.ParkedFilter) ([]subscriptions.ParkedEvent, error) {
	args := []any{subscriberKey(subscriber), subscriber}
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	where := bySubscriber
	if filter.EventType != "" {
		where += " AND event_type = " + arg(filter.EventType)
	}
	if filter.AggregateID != "" {
		where += " AND aggregate_id = " + arg(filter.AggregateID)
	}
	where += " AND position > " + arg(filter.AfterPosition)
	limit := ""
	if filter.Limit > 0 {
		limit = " LIMIT " + arg(filter.Limit)
	}
	rows, err := l.pool.Query(ctx, l.stmt.selectParked+where+` ORDER BY position, event_id`+limit, args...)
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rows, scanParked)
	if err != nil {
		return nil, err
	}
	if out == nil {
		out = []subscriptions.ParkedEvent{}
	}
	return out, nil
}

// ListFiltered returns the subscriber's parked events matching filter,
// ordered by position (then event ID), at most filter.Limit of them when
// it is positive, never nil (subscriptions.ManagedParkingLot).
func (l *ParkingLot) ListFiltered(ctx context.Context, subscriber string, filter subscriptions.ParkedFilter) ([]subscriptions.ParkedEvent, error) {
	out, err := l.selectParked(ctx, subscriber, filter)
	if err != nil {
		return nil, fmt.Errorf("pgxstore: list parked events of %q (filter %+v): %w", subscriber, filter, err)
	}
	return out, nil
}

// Get returns one parked entry, or an error wrapping
// subscriptions.ErrEventNotParked.
func (l *ParkingLot) Get(ctx context.Context, subscriber, eventID string) (subscriptions.ParkedEvent, error) {
	p, err := l.get(ctx, subscriber, eventID)
	if err != nil {
		return subscriptions.ParkedEvent{}, fmt.Errorf("pgxstore: parked event %q of %q: %w", eventID, subscriber, err)
	}
	return p, nil
}

func (l *ParkingLot) get(ctx context.Context, subscriber, eventID string) (subscriptions.ParkedEvent, error) {
	return l.getParked(ctx, l.pool, subscriber, eventID)
}

// getParked reads one entry through q.
func (l *ParkingLot) getParked(ctx context.Context, q querier, subscriber, eventID string) (subscriptions.ParkedEvent, error) {
	rows, err := q.Query(ctx, l.stmt.get, entryKey(subscriber, eventID), subscriber, eventID)
	if err != nil {
		return subscriptions.ParkedEvent{}, err
	}
	p, err := pgx.CollectExactlyOneRow(rows, scanParked)
	if errors.Is(err, pgx.ErrNoRows) {
		return subscriptions.ParkedEvent{}, subscriptions.ErrEventNotParked
	}
	return p, err
}

// Discard deletes a parked entry without running any handler and returns
// it as it was, and makes the next entry of its queue the head when it
// was the head (subscriptions.OrderedParkingLot), in one transaction. An
// entry being replayed is refused with an error wrapping
// subscriptions.ErrReplayInProgress, as a second replay is: its row lock
// (FOR NO KEY UPDATE, as a replay's) is skipped, not waited for, and a
// skipped row that still exists is busy. An entry that is not parked is an
// error wrapping subscriptions.ErrEventNotParked.
func (l *ParkingLot) Discard(ctx context.Context, subscriber, eventID string) (subscriptions.ParkedEvent, error) {
	var p subscriptions.ParkedEvent
	// READ COMMITTED, as a replay's: see promote.
	err := pgx.BeginTxFunc(ctx, l.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		var err error
		if p, err = l.getParked(ctx, tx, subscriber, eventID); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, l.stmt.discard, entryKey(subscriber, eventID), subscriber, eventID)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return pgx.ErrNoRows
		}
		return l.promote(ctx, tx, subscriber, p.AggregateID)
	})
	if err == nil {
		return p, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) && !errors.Is(err, subscriptions.ErrEventNotParked) {
		return subscriptions.ParkedEvent{}, fmt.Errorf("pgxstore: discard event %q of %q: %w", eventID, subscriber, err)
	}
	// Skipped: absent, or locked by a replay.
	if _, err := l.get(ctx, subscriber, eventID); err == nil {
		return subscriptions.ParkedEvent{}, fmt.Errorf("pgxstore: discard event %q of %q: %w", eventID, subscriber, subscriptions.ErrReplayInProgress)
	} else if !errors.Is(err, subscriptions.ErrEventNotParked) {
		return subscriptions.ParkedEvent{}, fmt.Errorf("pgxstore: discard event %q of %q: read the entry: %w", eventID, subscriber, err)
	}
	return subscriptions.ParkedEvent{}, fmt.Errorf("pgxstore: discard event %q of %q: %w", eventID, subscriber, subscriptions.ErrEventNotParked)
}

// RecordReplayFailure counts a failed replay on the entry: one more
// attempt, errText as its error (stored as Park stores text) and at as
// its ParkedAt. An entry no longer parked is left alone and is not an
// error: a concurrent replay may have cleared it.
func (l *ParkingLot) RecordReplayFailure(ctx context.Context, subscriber, eventID, errText string, at time.Time) error {
	if _, err := l.pool.Exec(ctx, l.stmt.replayFailed, entryKey(subscriber, eventID), subscriber, eventID, storableText(errText), at.UTC()); err != nil {
		return fmt.Errorf("pgxstore: record the failed replay of event %q for %q: %w", eventID, subscriber, err)
	}
	return nil
}
