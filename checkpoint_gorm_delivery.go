package subscriptions

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// GormCheckpointStore's delivery marks (DeliveryMarker): the redelivery
// mark is a column of the checkpoint row, written by the reset's own
// upsert and read with the row's lock (lockRowQuery); the catch-up mark is
// a row of subscriber_catch_ups under the name's pause key.

var _ DeliveryMarker = (*GormCheckpointStore)(nil)

// resetRowQuery is the checkpoint write of every reset (ResetWith,
// ResetAll): it moves the row to the new position, creating it if
// needed, and keeps in redelivered_through the highest checkpoint the row
// had, in the same statement (see DeliveryMarker). Its arguments: the
// row, the position, the time. Both engines read the existing row
// through the table's name in DO UPDATE.
func resetRowQuery(t gormTables) string {
	return `INSERT INTO ` + t.checkpoints + ` (subscriber, position, updated_at) VALUES (?, ?, ?)
	ON CONFLICT (subscriber) DO UPDATE SET position = excluded.position, updated_at = excluded.updated_at,
		redelivered_through = CASE WHEN subscriber_checkpoints.position > subscriber_checkpoints.redelivered_through
			THEN subscriber_checkpoints.position ELSE subscriber_checkpoints.redelivered_through END`
}

// StartCatchUp records the mark in one statement, which inserts nothing
// when key has a mark or one of rows exists (see DeliveryMarker).
func (g *GormCheckpointStore) StartCatchUp(ctx context.Context, key string, rows []string, through int64) error {
	if err := g.db.WithContext(ctx).Exec(`INSERT INTO `+g.sql.catchUps+` (subscriber, through, started_at)
		SELECT ?, ?, ? WHERE NOT EXISTS (SELECT 1 FROM `+g.sql.checkpoints+` WHERE subscriber IN ?)
		ON CONFLICT (subscriber) DO NOTHING`, key, through, time.Now().UTC(), rows).Error; err != nil {
		return fmt.Errorf("subscriptions: record the catch-up of %q through %d: %w", key, through, err)
	}
	return nil
}

// clearCatchUpsIn deletes the catch-up marks of the names' keys in tx
// (Delete and its partitioned form: a retired name starts afresh). The
// rows' redelivery marks go with the rows.
func (t gormTables) clearCatchUpsIn(tx *gorm.DB, names ...string) error {
	keys := make([]string, 0, len(names))
	for _, name := range names {
		keys = append(keys, PauseKey(name))
	}
	if err := tx.Exec("DELETE FROM "+t.catchUps+" WHERE subscriber IN ?", keys).Error; err != nil {
		return fmt.Errorf("clear the catch-up mark: %w", err)
	}
	return nil
}
