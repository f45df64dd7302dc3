package subscriptions

import (
	"context"
	"errors"
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
		if err := tx.Exec(g.sql.resetRow, subscriber, position, time.Now().UTC()).Error; err != nil {
			return err
		}
		return g.sql.clearAttemptsIn(tx, subscriber)
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
		if err := tx.Exec(g.sql.deleteRow, subscriber).Error; err != nil {
			return err
		}
		if err := g.sql.clearPausesIn(tx, subscriber); err != nil {
			return err
		}
		if err := g.sql.clearCatchUpsIn(tx, subscriber); err != nil {
			return err
		}
		return g.sql.clearAttemptsIn(tx, subscriber)
	}, apply)
}

// fenced runs write (the checkpoint change, first, so that on Postgres it
// takes the row lock before apply runs) and apply in one transaction,
// with the subscriber's batches held off. When it returns, nothing of the
// transaction holds a lock any more, whether it committed, failed or was
// abandoned because ctx ended (see fencedOnServer).
func (g *GormCheckpointStore) fenced(ctx context.Context, subscriber, what string, write func(tx *gorm.DB) error, apply func(ctx context.Context) error) error {
	if err := ctx.Err(); err != nil {
		// Before anything is touched: an abandoned reset leaves a batch in
		// flight alone (on SQLite the fence would abort it).
		return fmt.Errorf("subscriptions: %s: %w", what, err)
	}
	run := func(tx *gorm.DB) error {
		if err := write(tx); err != nil {
			return err
		}
		if apply == nil {
			return nil
		}
		actx, guard := handlerContext(ctx, tx, g.pool, !g.dialect.RowLocks)
		if err := errors.Join(apply(actx), guard.finished(ctx)); err != nil {
			return applyError(err)
		}
		return nil
	}
	var err error
	if g.reg == nil { // row locks: the transaction waits for the batch's
		err = g.fencedOnServer(ctx, run)
	} else {
		var release func()
		release, err = g.fenceSQLite(ctx, subscriber, what)
		if err != nil {
			return err
		}
		defer release()
		err = g.db.WithContext(ctx).Transaction(run, g.txOptions())
	}
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
			return fmt.Errorf("subscriptions: %s: %w: %w", what, ctxErr, err)
		}
		return fmt.Errorf("subscriptions: %s: %w", what, err)
	}
	return nil
}

// fencedOnServer runs the transaction on a connection of its own, with
// ctx's cancellation handled on the server rather than by the driver. A
// driver that gives up when ctx ends closes its socket but leaves the
// server running the statement: the checkpoint write, waiting for the row
// lock of a batch in flight, would take that lock once the batch ended and
// hold it until the server noticed the closed socket, so the caller's next
// Acquire could find the row still locked by the abandoned transaction.
// Here the statements run without ctx's cancellation, the statement
// running when ctx ends is cancelled on the server (cancelBackendOnDone),
// the transaction rolls back, and only then does fencedOnServer return.
// It needs the dialect's RowLocks (a server to cancel on).
func (g *GormCheckpointStore) fencedOnServer(ctx context.Context, run func(tx *gorm.DB) error) error {
	return g.db.WithContext(context.WithoutCancel(ctx)).Connection(func(conn *gorm.DB) error {
		var pid int64
		if err := conn.Raw(g.dialect.BackendPID()).Scan(&pid).Error; err != nil {
			return fmt.Errorf("read backend pid: %w", err)
		}
		stop := cancelBackendOnDone(ctx, conn, g.db, g.dialect, pid)
		defer func() {
			if stop() {
				discardConn(conn)
			}
		}()
		return conn.Transaction(func(tx *gorm.DB) error {
			if err := run(tx); err != nil {
				return err
			}
			// Abandoned after the last statement: roll back, do not commit.
			return ctx.Err()
		}, g.txOptions())
	})
}
