package subscriptions

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/internal/dialect"
)

// This file holds GormParkingLot's queues (OrderedParkingLot): the
// statements are the dialect's (ParkHold, PromoteHead, DeleteParked,
// HeldByColumn), so that pgxstore's lot, on the same table, keeps the
// same rules.

// ParkedHeads returns the head of each of the subscriber's queues, through
// the batch transaction in ctx when it is on the lot's database: one
// statement on the partial index of the entries that are not held (the
// heads, and entries parked for their own failure behind one, of which
// the first per aggregate is kept).
func (g *GormParkingLot) ParkedHeads(ctx context.Context, subscriber string) ([]ParkedEvent, error) {
	where, args := g.dialect.ParkedSubscriber(subscriber)
	var rows []GormParkedEventModel
	if err := g.queryDB(ctx).Raw(`SELECT `+parkedColumns+` FROM `+g.parked+` WHERE `+where+` AND held_by = '' AND aggregate_id <> ''
		ORDER BY aggregate_id, position, event_id`, args...).Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("subscriptions: read the queues of %q: %w", subscriber, err)
	}
	out := make([]ParkedEvent, 0, len(rows))
	for i, r := range rows {
		if i == 0 || r.AggregateID != rows[i-1].AggregateID {
			out = append(out, r.parkedEvent())
		}
	}
	return out, nil
}

// Hold parks held behind the head of its aggregate's queue when that lies
// before it, through the batch transaction as Park (dialect.ParkHold), and
// returns the head's event ID; "" when the aggregate has no entry before
// it, and nothing is written.
func (g *GormParkingLot) Hold(ctx context.Context, held ParkedEvent) (string, error) {
	if err := validateParked(held); err != nil {
		return "", err
	}
	if held.ParkedAt.IsZero() {
		held.ParkedAt = time.Now()
	}
	query, args := g.dialect.ParkHold(g.parked, dialect.ParkedRow{
		Subscriber: held.Subscriber, EventID: held.EventID, EventType: storableText(held.EventType),
		Position: held.Position, Error: storableText(held.Error), Attempts: held.Attempts,
		ParkedAt: held.ParkedAt.UTC(), AggregateID: storableText(held.AggregateID),
	})
	var heads []string
	if err := g.queryDB(ctx).Raw(query, args...).Scan(&heads).Error; err != nil {
		return "", fmt.Errorf("subscriptions: hold event %q (position %d) for %q: %w", held.EventID, held.Position, held.Subscriber, err)
	}
	if len(heads) == 0 {
		return "", nil
	}
	return heads[0], nil
}

// CountHeld returns how many of the subscriber's entries are held.
func (g *GormParkingLot) CountHeld(ctx context.Context, subscriber string) (int, error) {
	where, args := g.dialect.ParkedSubscriber(subscriber)
	var n int64
	if err := g.db.WithContext(ctx).Raw(`SELECT COUNT(*) FROM `+g.parked+` WHERE `+where+` AND held_by <> ''`, args...).Scan(&n).Error; err != nil {
		return 0, fmt.Errorf("subscriptions: count held events of %q: %w", subscriber, err)
	}
	return int(n), nil
}

// queryDB is the batch transaction in ctx when it is on the lot's
// database, else the lot's handle, bound to ctx.
func (g *GormParkingLot) queryDB(ctx context.Context) *gorm.DB {
	if tx := g.batchTx(ctx); tx != nil {
		return tx.WithContext(ctx)
	}
	return g.db.WithContext(ctx)
}

// deleteParked deletes the subscriber's rows of where and keeps every
// queue it deletes from headed, in one transaction: the batch's when ctx
// carries one on the lot's database; on Postgres one statement anyway; on
// SQLite otherwise one of its own.
func (g *GormParkingLot) deleteParked(ctx context.Context, subscriber, where string, args []any) error {
	query, all, promote := g.dialect.DeleteParked(g.parked, subscriber, where, args)
	db := g.queryDB(ctx)
	if !promote {
		return db.Exec(query, all...).Error
	}
	run := func(tx *gorm.DB) error {
		var aggregates []string
		if err := tx.Raw(query, all...).Scan(&aggregates).Error; err != nil {
			return err
		}
		seen := map[string]bool{}
		for _, a := range aggregates {
			if !seen[a] {
				seen[a] = true
				if err := g.promote(tx, subscriber, a); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if g.batchTx(ctx) != nil {
		return run(db)
	}
	return db.Transaction(run, g.dialect.TxOptionsList()...)
}

// promote makes the first entry of the subscriber's queue of aggregate its
// head, through tx, after an entry of it was removed there.
func (g *GormParkingLot) promote(tx *gorm.DB, subscriber, aggregate string) error {
	if aggregate == "" {
		return nil
	}
	query, args := g.dialect.PromoteHead(g.parked, subscriber, aggregate)
	if err := tx.Exec(query, args...).Error; err != nil {
		return fmt.Errorf("make the next entry of aggregate %q the head of its queue: %w", aggregate, err)
	}
	return nil
}

// head returns the event ID of the head of the subscriber's queue of
// aggregate ("" when it has none), through tx.
func (g *GormParkingLot) head(tx *gorm.DB, subscriber, aggregate string) (string, error) {
	where, args := g.dialect.ParkedSubscriber(subscriber)
	var ids []string
	if err := tx.Raw(`SELECT event_id FROM `+g.parked+` WHERE `+where+` AND aggregate_id = ? AND held_by = '' ORDER BY position, event_id LIMIT 1`,
		append(args, aggregate)...).Scan(&ids).Error; err != nil {
		return "", fmt.Errorf("read the head of aggregate %q: %w", aggregate, err)
	}
	if len(ids) == 0 {
		return "", nil
	}
	return ids[0], nil
}
