package subscriptions

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// ResetWith runs apply and sets the subscriber's checkpoint to position in
// one transaction (see CheckpointResetter). On Postgres the transaction
// first writes the checkpoint row, which waits for the batch in flight
// (it holds the row) and then keeps every replica's Acquire skipping until
// the commit; on SQLite the store's Reset fence aborts the batch in
// flight (its Commit fails with ErrCheckpointMoved) and keeps new batches
// out until the commit.
func (g *GormCheckpointStore) ResetWith(ctx context.Context, subscriber string, position int64, apply func(ctx context.Context) error) error {
	if err := validateName(subscriber); err != nil {
		return fmt.Errorf("subscriptions: reset: %w", err)
	}
	if err := validatePosition(subscriber, position); err != nil {
		return err
	}
	what := fmt.Sprintf("reset checkpoint of %q to %d", subscriber, position)
	return g.fenced(ctx, subscriber, what, func(tx *gorm.DB) error {
		return tx.Exec(`INSERT INTO subscriber_checkpoints (subscriber, position, updated_at) VALUES (?, ?, ?)
			ON CONFLICT (subscriber) DO UPDATE SET position = excluded.position, updated_at = excluded.updated_at`,
			subscriber, position, time.Now().UTC()).Error
	}, apply)
}

// Delete runs apply and deletes the subscriber's checkpoint row in one
// transaction (see CheckpointResetter), holding off batches as ResetWith
// does.
func (g *GormCheckpointStore) Delete(ctx context.Context, subscriber string, apply func(ctx context.Context) error) error {
	if err := validateName(subscriber); err != nil {
		return fmt.Errorf("subscriptions: delete checkpoint: %w", err)
	}
	what := fmt.Sprintf("delete checkpoint of %q", subscriber)
	return g.fenced(ctx, subscriber, what, func(tx *gorm.DB) error {
		return tx.Exec("DELETE FROM subscriber_checkpoints WHERE subscriber = ?", subscriber).Error
	}, apply)
}

// fenced runs write (the checkpoint change, first, so that on Postgres it
// takes the row lock before apply runs) and apply in one transaction,
// with the subscriber's batches held off.
func (g *GormCheckpointStore) fenced(ctx context.Context, subscriber, what string, write func(tx *gorm.DB) error, apply func(ctx context.Context) error) error {
	if err := ctx.Err(); err != nil {
		// Before anything is touched: an abandoned reset leaves a batch in
		// flight alone (on SQLite the fence would abort it).
		return fmt.Errorf("subscriptions: %s: %w", what, err)
	}
	if !g.postgres {
		release, err := g.fenceSQLite(ctx, subscriber, what)
		if err != nil {
			return err
		}
		defer release()
	}
	err := g.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := write(tx); err != nil {
			return err
		}
		if apply == nil {
			return nil
		}
		if err := apply(withTx(ctx, tx, g.pool)); err != nil {
			return applyError(err)
		}
		return nil
	}, g.txOptions())
	if err != nil {
		return fmt.Errorf("subscriptions: %s: %w", what, err)
	}
	return nil
}
