package pgxstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/eventfeed/subscriptions"
)

// This file holds CheckpointStore's multi-row operations for partitioned
// subscribers (subscriptions.PartitionCheckpointStore): one read for
// every partition's checkpoint, one transaction to reset them all or to
// seed them.

var _ subscriptions.PartitionCheckpointStore = (*CheckpointStore)(nil)

// Positions reads the checkpoints of names in one statement, through the
// transaction in ctx when it was begun on this store's pool (a reset's or
// delete's, whose guard reads the partition count), else on the pool.
func (s *CheckpointStore) Positions(ctx context.Context, names []string) ([]int64, error) {
	if len(names) == 0 {
		return []int64{}, nil
	}
	var q querier = s.pool
	if tx := txForPool(ctx, s.pool); tx != nil {
		q = tx.Tx
	}
	rows, err := q.Query(ctx, s.stmt.positions, names)
	if err != nil {
		return nil, fmt.Errorf("pgxstore: read %d checkpoints (%q ...): %w", len(names), names[0], err)
	}
	byName := make(map[string]int64, len(names))
	var name string
	var position int64
	if _, err := pgx.ForEachRow(rows, []any{&name, &position}, func() error {
		byName[name] = position
		return nil
	}); err != nil {
		return nil, fmt.Errorf("pgxstore: read %d checkpoints (%q ...): %w", len(names), names[0], err)
	}
	out := make([]int64, len(names))
	for i, n := range names {
		out[i] = byName[n]
	}
	return out, nil
}

// ResetAll upserts every row, in name order, then runs apply, in one
// transaction: the upserts wait for the row locks of in-flight batches
// (whose locks are SKIP LOCKED, so they never wait on the reset) and keep
// every replica's batches of these names out until the commit.
func (s *CheckpointStore) ResetAll(ctx context.Context, names []string, position int64, guard, apply func(ctx context.Context) error) error {
	if len(names) == 0 {
		return nil
	}
	if position < 0 {
		return fmt.Errorf("pgxstore: reset %d checkpoints: position %d is negative", len(names), position)
	}
	what := fmt.Sprintf("reset %d checkpoints (%q ...) to %d", len(names), names[0], position)
	return s.fencedAll(ctx, names, what, func(ctx context.Context, tx pgx.Tx, name string) error {
		if _, err := tx.Exec(ctx, s.stmt.resetRow, name, position, time.Now().UTC()); err != nil {
			return err
		}
		return s.clearAttempts(ctx, tx, name)
	}, guard, apply)
}

// DeleteAll deletes every row (with its pause, catch-up mark and attempt
// record), then
// runs apply, in one transaction, holding off batches as ResetAll does.
func (s *CheckpointStore) DeleteAll(ctx context.Context, names []string, guard, apply func(ctx context.Context) error) error {
	if len(names) == 0 {
		return nil
	}
	what := fmt.Sprintf("delete %d checkpoints (%q ...)", len(names), names[0])
	return s.fencedAll(ctx, names, what, func(ctx context.Context, tx pgx.Tx, name string) error {
		if _, err := tx.Exec(ctx, s.stmt.deleteRow, name); err != nil {
			return err
		}
		if err := s.clearKeyed(ctx, tx, name); err != nil {
			return err
		}
		return s.clearAttempts(ctx, tx, name)
	}, guard, apply)
}

// fencedAll runs guard, then write for each name in name order, then
// apply, in one transaction (onServer). guard runs before the writes, so
// that it reads the rows as they were.
func (s *CheckpointStore) fencedAll(ctx context.Context, names []string, what string, write func(ctx context.Context, tx pgx.Tx, name string) error, guard, apply func(ctx context.Context) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pgxstore: %s: %w", what, err)
	}
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	err := s.onServer(ctx, func(tctx context.Context, tx pgx.Tx) error {
		htx := newHandlerTx(tx, s.pool)
		if guard != nil {
			if err := guard(withTx(tctx, htx)); err != nil {
				return err
			}
		}
		for _, name := range sorted {
			if err := write(tctx, tx, name); err != nil {
				return fmt.Errorf("%q: %w", name, err)
			}
		}
		if apply == nil {
			return nil
		}
		if err := errors.Join(apply(withTx(tctx, htx)), htx.misused()); err != nil {
			return fmt.Errorf("apply: %w", err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("pgxstore: %s: %w", what, err)
	}
	return nil
}

// InitPartitions locks the marker row first, so that replicas starting
// together seed once.
func (s *CheckpointStore) InitPartitions(ctx context.Context, marker, plain string, parts []string, n int64) (int64, error) {
	var existing int64
	err := pgx.BeginTxFunc(ctx, s.pool, txOptions, func(tx pgx.Tx) error {
		now := time.Now().UTC()
		if _, err := tx.Exec(ctx, s.stmt.createRow, marker, now); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, s.stmt.lockPosition, marker).Scan(&existing); err != nil {
			return err
		}
		if existing != 0 {
			return nil
		}
		var seed, redelivered int64
		if err := tx.QueryRow(ctx, s.stmt.seedOf, plain, subscriptions.RetiredCheckpoint).Scan(&seed, &redelivered); err != nil {
			return err
		}
		// A retired row (left by a Repartition) is seeded as a missing one.
		if _, err := tx.Exec(ctx, s.stmt.seedRows, parts, seed, now, redelivered, subscriptions.RetiredCheckpoint); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, s.stmt.setPosition, n, now, marker)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("pgxstore: initialise the partitions of %q: %w", plain, err)
	}
	return existing, nil
}
