package subscriptions

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"gorm.io/gorm"
)

// This file holds GormCheckpointStore's multi-row operations for
// partitioned subscribers (partitionStore): one read for every partition's
// checkpoint, one transaction to reset them all or to seed them.

var _ PartitionCheckpointStore = (*GormCheckpointStore)(nil)

// Positions reads through the transaction in ctx when it is one of this
// store's pool (a reset's or delete's, whose guard reads the partition
// count), else on the pool.
func (g *GormCheckpointStore) Positions(ctx context.Context, names []string) ([]int64, error) {
	db := g.db
	if tx := txForPool(ctx, g.pool); tx != nil {
		db = tx
	}
	var rows []GormCheckpointModel
	if err := db.WithContext(ctx).Raw("SELECT subscriber, position FROM "+g.sql.checkpoints+" WHERE subscriber IN ?", names).Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("subscriptions: read %d checkpoints (%q ...): %w", len(names), names[0], err)
	}
	return checkpointsOf(rows, names), nil
}

// checkpointsOf returns the positions of names in rows, 0 for a name
// without a row.
func checkpointsOf(rows []GormCheckpointModel, names []string) []int64 {
	byName := make(map[string]int64, len(rows))
	for _, r := range rows {
		byName[r.Subscriber] = r.Position
	}
	out := make([]int64, len(names))
	for i, name := range names {
		out[i] = byName[name]
	}
	return out
}

// ResetAll upserts every row, then runs apply, in one transaction. On
// Postgres the upserts wait for the row locks of in-flight batches, taken
// in name order (the batches' locks are SKIP LOCKED, so they never wait on
// the reset), and keep every replica's batches of these names out until
// the commit. On SQLite each name is fenced first, as Reset does.
func (g *GormCheckpointStore) ResetAll(ctx context.Context, names []string, position int64, guard, apply func(ctx context.Context) error) error {
	if len(names) == 0 {
		return nil
	}
	if err := validatePosition(names[0], position); err != nil {
		return err
	}
	what := fmt.Sprintf("reset %d checkpoints (%q ...) to %d", len(names), names[0], position)
	return g.fencedAll(ctx, names, what, func(tx *gorm.DB, name string) error {
		if err := tx.Exec(g.sql.resetRow, name, position, time.Now().UTC()).Error; err != nil {
			return err
		}
		return g.sql.clearAttemptsIn(tx, name)
	}, guard, apply)
}

// DeleteAll deletes every row, then runs apply, in one transaction,
// holding off batches as resetAll does.
func (g *GormCheckpointStore) DeleteAll(ctx context.Context, names []string, guard, apply func(ctx context.Context) error) error {
	if len(names) == 0 {
		return nil
	}
	what := fmt.Sprintf("delete %d checkpoints (%q ...)", len(names), names[0])
	return g.fencedAll(ctx, names, what, func(tx *gorm.DB, name string) error {
		if err := tx.Exec(g.sql.deleteRow, name).Error; err != nil {
			return err
		}
		if err := g.sql.clearPausesIn(tx, name); err != nil {
			return err
		}
		if err := g.sql.clearCatchUpsIn(tx, name); err != nil {
			return err
		}
		return g.sql.clearAttemptsIn(tx, name)
	}, guard, apply)
}

// fencedAll is fenced for several names: guard first, then write for each
// name, in name order, then apply, all in one transaction. guard runs
// before the writes, so that it reads the rows as they were (a delete
// writes the partition count's row too).
func (g *GormCheckpointStore) fencedAll(ctx context.Context, names []string, what string, write func(tx *gorm.DB, name string) error, guard, apply func(ctx context.Context) error) error {
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	if g.reg != nil {
		for _, name := range sorted {
			release, err := g.fenceSQLite(ctx, name, what)
			if err != nil {
				return err
			}
			defer release()
		}
	}
	err := g.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if guard != nil {
			if err := guard(withTx(ctx, tx, g.pool)); err != nil {
				return err
			}
		}
		for _, name := range sorted {
			if err := write(tx, name); err != nil {
				return fmt.Errorf("%q: %w", name, err)
			}
		}
		if apply == nil {
			return nil
		}
		actx, guard := handlerContext(ctx, tx, g.pool, !g.dialect.RowLocks)
		if err := errors.Join(apply(actx), guard.finished(ctx)); err != nil {
			return applyError(err)
		}
		return nil
	}, g.txOptions())
	if err != nil {
		return fmt.Errorf("subscriptions: %s: %w", what, err)
	}
	return nil
}

// InitPartitions takes the marker row's lock (Postgres) or the write lock
// (SQLite) first, so that replicas starting together seed once; a
// retired row (RetiredCheckpoint) is seeded as a missing one.
func (g *GormCheckpointStore) InitPartitions(ctx context.Context, marker, plain string, parts []string, n int64) (int64, error) {
	var existing int64
	err := g.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		now := time.Now().UTC()
		if err := tx.Exec(g.sql.createRow, marker, now).Error; err != nil {
			return err
		}
		if err := tx.Raw(g.sql.position+g.dialect.ForUpdate(), marker).Scan(&existing).Error; err != nil {
			return err
		}
		if existing != 0 {
			return nil
		}
		var seed struct{ Position, Redelivered int64 }
		if err := tx.Raw("SELECT COALESCE(MAX(position), 0) AS position, COALESCE(MAX(redelivered_through), 0) AS redelivered FROM "+g.sql.checkpoints+" WHERE subscriber = ? AND position <> ?", plain, RetiredCheckpoint).Scan(&seed).Error; err != nil {
			return err
		}
		for _, part := range parts {
			if err := tx.Exec(`INSERT INTO `+g.sql.checkpoints+` (subscriber, position, updated_at, redelivered_through) VALUES (?, ?, ?, ?)
				ON CONFLICT (subscriber) DO UPDATE SET position = excluded.position, updated_at = excluded.updated_at, redelivered_through = excluded.redelivered_through WHERE subscriber_checkpoints.position = ?`,
				part, seed.Position, now, seed.Redelivered, RetiredCheckpoint).Error; err != nil {
				return err
			}
		}
		return tx.Exec("UPDATE "+g.sql.checkpoints+" SET position = ?, updated_at = ? WHERE subscriber = ?", n, now, marker).Error
	}, g.txOptions())
	if err != nil {
		return 0, fmt.Errorf("subscriptions: initialise the partitions of %q: %w", plain, err)
	}
	return existing, nil
}
