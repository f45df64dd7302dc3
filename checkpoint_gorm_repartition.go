package subscriptions

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/eventrow"
)

var _ Repartitioner = (*GormCheckpointStore)(nil)

// Repartition changes the layout in one transaction (see Repartitioner).
// The transaction creates the count's row and the missing rows of from
// (uncommitted: a batch creating one waits for the commit) and locks the
// count's row first (as InitPartitions does), then every row in name
// order: on Postgres that waits for the batches in flight, which hold
// their rows, while the others skip them (SKIP LOCKED); on SQLite every
// row is fenced first, as Reset fences (the batch in flight is ended),
// and the first write takes the database's write lock, after any commit
// under way. catchUp then reads the checkpoints, and the feed, in the
// transaction: it needs no second connection. When it returns, nothing of
// the transaction holds a lock any more (see fencedOnServer).
func (g *GormCheckpointStore) Repartition(ctx context.Context, marker string, from, to []string, count int64, catchUp RepartitionCatchUp) error {
	what := fmt.Sprintf("repartition %q", PauseKey(marker))
	all := layoutRows(marker, from, to)
	for _, name := range all {
		if err := validateName(name); err != nil {
			return fmt.Errorf("subscriptions: %s: %w", what, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("subscriptions: %s: %w", what, err)
	}
	run := func(tx *gorm.DB) error {
		if err := g.holdLayout(tx, marker, from, all); err != nil {
			return fmt.Errorf("hold the batches: %w", err)
		}
		held, err := g.readLayout(tx, marker, from, all)
		if err != nil {
			return fmt.Errorf("read the checkpoints: %w", err)
		}
		read := func(ctx context.Context, after, upTo int64, limit int) ([]domain.EventEnvelope[any], error) {
			return eventrow.ReadFrom(ctx, tx, g.sql.events, "WHERE position > ? AND position <= ? ORDER BY position LIMIT ?", after, upTo, limit)
		}
		target, apply, err := catchUp(ctx, held, read)
		if err != nil {
			return err
		}
		if apply != nil {
			actx, guard := handlerContext(ctx, tx, g.pool, !g.dialect.RowLocks)
			if err := errors.Join(apply(actx), guard.finished(ctx)); err != nil {
				return err
			}
		}
		if err := g.writeLayout(tx, marker, from, to, target, count, held.LowestRedelivery()); err != nil {
			return fmt.Errorf("write the checkpoints: %w", err)
		}
		return nil
	}
	var err error
	if g.reg == nil {
		err = g.fencedOnServer(ctx, run)
	} else {
		for _, name := range all {
			release, ferr := g.fenceSQLite(ctx, name, what)
			if ferr != nil {
				return ferr
			}
			defer release()
		}
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

// holdLayout creates the count's row and the missing rows of from and
// locks the count's row, then every row of all in name order (on SQLite
// the first write takes the database's write lock).
func (g *GormCheckpointStore) holdLayout(tx *gorm.DB, marker string, from, all []string) error {
	now, forUpdate := time.Now().UTC(), g.dialect.ForUpdate()
	if err := g.upsertCheckpoints(tx, []string{marker}, 0, now, false); err != nil {
		return err
	}
	if err := tx.Exec(g.sql.position+forUpdate, marker).Error; err != nil {
		return err
	}
	sorted := slices.Sorted(slices.Values(from))
	if err := g.upsertCheckpoints(tx, sorted, 0, now, false); err != nil {
		return err
	}
	return tx.Exec("SELECT subscriber FROM "+g.sql.checkpoints+" WHERE subscriber IN ? ORDER BY subscriber"+forUpdate, all).Error
}

// readLayout reads, under the hold, the count's row and from's
// checkpoints and delivery marks (DeliveryMarker), the name's catch-up
// mark under marker's pause key.
func (g *GormCheckpointStore) readLayout(tx *gorm.DB, marker string, from, all []string) (RepartitionRows, error) {
	var rows []GormCheckpointModel
	if err := tx.Raw("SELECT subscriber, position, redelivered_through FROM "+g.sql.checkpoints+" WHERE subscriber IN ?", all).Scan(&rows).Error; err != nil {
		return RepartitionRows{}, err
	}
	var catchUp int64
	if err := tx.Raw("SELECT "+g.sql.catchUp, PauseKey(marker)).Scan(&catchUp).Error; err != nil {
		return RepartitionRows{}, err
	}
	byName := make(map[string]GormCheckpointModel, len(rows))
	for _, r := range rows {
		byName[r.Subscriber] = r
	}
	held := RepartitionRows{Recorded: byName[marker].Position, Positions: make([]int64, len(from)), Marks: make([]DeliveryMarks, len(from))}
	for i, name := range from {
		held.Positions[i] = byName[name].Position
		held.Marks[i] = DeliveryMarks{RedeliveredThrough: byName[name].RedeliveredThrough, CatchUpThrough: catchUp}
	}
	return held, nil
}

// writeLayout writes the new layout: to at target with the redelivery
// mark redelivered, the rest of from retired, their attempt records
// cleared, the count recorded.
func (g *GormCheckpointStore) writeLayout(tx *gorm.DB, marker string, from, to []string, target, count, redelivered int64) error {
	now := time.Now().UTC()
	if err := g.upsertCheckpoints(tx, to, target, now, true); err != nil {
		return err
	}
	if err := tx.Exec("UPDATE "+g.sql.checkpoints+" SET redelivered_through = ? WHERE subscriber IN ?", redelivered, to).Error; err != nil {
		return err
	}
	var retired []string
	for _, name := range from {
		if !slices.Contains(to, name) {
			retired = append(retired, name)
		}
	}
	if err := g.upsertCheckpoints(tx, retired, RetiredCheckpoint, now, true); err != nil {
		return err
	}
	if err := g.sql.clearAttemptsIn(tx, append(slices.Clone(from), to...)...); err != nil {
		return err
	}
	return g.upsertCheckpoints(tx, []string{marker}, count, now, true)
}

// upsertCheckpoints writes the rows of names at position in statements of
// up to 300 rows; replace false leaves existing rows as they are.
func (g *GormCheckpointStore) upsertCheckpoints(tx *gorm.DB, names []string, position int64, now time.Time, replace bool) error {
	conflict := " ON CONFLICT (subscriber) DO NOTHING"
	if replace {
		conflict = " ON CONFLICT (subscriber) DO UPDATE SET position = excluded.position, updated_at = excluded.updated_at"
	}
	for chunk := range slices.Chunk(names, 300) {
		args := make([]any, 0, 3*len(chunk))
		for _, name := range chunk {
			args = append(args, name, position, now)
		}
		q := "INSERT INTO " + g.sql.checkpoints + " (subscriber, position, updated_at) VALUES " +
			strings.TrimSuffix(strings.Repeat("(?, ?, ?), ", len(chunk)), ", ") + conflict
		if err := tx.Exec(q, args...).Error; err != nil {
			return err
		}
	}
	return nil
}
