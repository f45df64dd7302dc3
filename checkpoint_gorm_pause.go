package subscriptions

import (
	"context"
	"fmt"
	"slices"
	"time"

	"gorm.io/gorm"
)

// pausedClause is the condition, on one argument (a pause key, see
// PauseKey, at the placeholder arg), that the name is paused: it has a row
// in subscriber_pauses. Batches read it with their checkpoint row's lock,
// so that a paused name's batches run nothing, and their commit refuses
// to move the checkpoint while it holds (see pause).
func pausedClause(t gormTables, arg string) string {
	return `EXISTS (SELECT 1 FROM ` + t.pauses + ` WHERE subscriber = ` + arg + `)`
}

var _ Pauser = (*GormCheckpointStore)(nil)

// Pause records key as paused, committed, and then waits until no batch of
// names is in flight: on Postgres by locking every row in name order (a
// batch in flight holds its row; one that locked its row before the Pause
// committed fails its commit, which checks the Pause again), on SQLite by
// the store's fence (the batch in flight is rolled back). The positions
// are read once that holds: the checkpoints no batch of names moves any
// more until resume.
func (g *GormCheckpointStore) Pause(ctx context.Context, key string, names []string, reason string) ([]int64, error) {
	what := fmt.Sprintf("pause %q", key)
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	if g.reg != nil {
		for _, name := range sorted {
			release, err := g.fenceSQLite(ctx, name, what)
			if err != nil {
				return nil, err
			}
			defer release()
		}
	}
	if err := g.db.WithContext(ctx).Exec("INSERT INTO "+g.sql.pauses+" (subscriber, paused_at, reason) VALUES (?, ?, ?) ON CONFLICT (subscriber) DO NOTHING",
		key, time.Now().UTC(), reason).Error; err != nil {
		return nil, fmt.Errorf("subscriptions: %s: %w", what, err)
	}
	var rows []GormCheckpointModel
	read := func(tx *gorm.DB) error {
		return tx.Raw("SELECT subscriber, position FROM "+g.sql.checkpoints+" WHERE subscriber IN ? ORDER BY subscriber"+g.dialect.ForUpdate(), sorted).Scan(&rows).Error
	}
	var err error
	if g.reg == nil {
		err = g.fencedOnServer(ctx, read) // waits for the batches' row locks
	} else {
		err = read(g.db.WithContext(ctx))
	}
	if err != nil {
		return nil, fmt.Errorf("subscriptions: %s: recorded, but waiting for the batches in flight failed (Resume lifts the pause): %w", what, err)
	}
	return checkpointsOf(rows, names), nil
}

func (g *GormCheckpointStore) Resume(ctx context.Context, key string) error {
	if err := g.db.WithContext(ctx).Exec("DELETE FROM "+g.sql.pauses+" WHERE subscriber = ?", key).Error; err != nil {
		return fmt.Errorf("subscriptions: resume %q: %w", key, err)
	}
	return nil
}

func (g *GormCheckpointStore) PausedSince(ctx context.Context, key string) (PauseRecord, bool, error) {
	var rows []struct {
		PausedAt time.Time
		Reason   string
	}
	if err := g.db.WithContext(ctx).Raw("SELECT paused_at, reason FROM "+g.sql.pauses+" WHERE subscriber = ?", key).Scan(&rows).Error; err != nil {
		return PauseRecord{}, false, fmt.Errorf("subscriptions: read the pause of %q: %w", key, err)
	}
	if len(rows) == 0 {
		return PauseRecord{}, false, nil
	}
	return PauseRecord{Since: rows[0].PausedAt.UTC(), Reason: rows[0].Reason}, true, nil
}

// clearPausesIn deletes the pauses of the names' keys in tx (Delete and
// its partitioned form: a retired name starts unpaused).
func (t gormTables) clearPausesIn(tx *gorm.DB, names ...string) error {
	keys := make([]string, 0, len(names))
	for _, name := range names {
		keys = append(keys, PauseKey(name))
	}
	if err := tx.Exec("DELETE FROM "+t.pauses+" WHERE subscriber IN ?", keys).Error; err != nil {
		return fmt.Errorf("clear the pause: %w", err)
	}
	return nil
}
