package pgxstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eventfeed/subscriptions"
)

// CheckpointStore's delivery marks (subscriptions.DeliveryMarker), in the
// GORM backend's columns and table: the redelivery mark in the checkpoint
// row (resetRow writes it, lockRow reads it), the catch-up mark in
// subscriber_catch_ups under the name's pause key.

// lockedRow is what checkpointSQL.lockRow reads.
type lockedRow struct {
	position, redelivered *int64 // nil: the row was not locked
	present, paused       bool
	catchUp               int64
}

// targets are the Scan destinations of lockRow's columns.
func (r *lockedRow) targets() []any {
	return []any{&r.position, &r.redelivered, &r.present, &r.paused, &r.catchUp}
}

// batch is the batch holding the locked row on conn, in tx.
func (r *lockedRow) batch(s *CheckpointStore, subscriber string, conn *pgxpool.Conn, tx pgx.Tx) *batch {
	marks := subscriptions.DeliveryMarks{CatchUpThrough: r.catchUp}
	if r.redelivered != nil {
		marks.RedeliveredThrough = *r.redelivered
	}
	return &batch{store: s, subscriber: subscriber, conn: conn, tx: tx, position: *r.position, marks: marks}
}

var _ subscriptions.MarkedBatch = (*batch)(nil)

// DeliveryMarks returns the marks the batch read with its checkpoint row.
func (b *batch) DeliveryMarks() subscriptions.DeliveryMarks { return b.marks }

// StartCatchUp records the mark in one statement, which inserts nothing
// when key has a mark or one of rows exists.
func (s *CheckpointStore) StartCatchUp(ctx context.Context, key string, rows []string, through int64) error {
	if _, err := s.pool.Exec(ctx, s.stmt.startCatchUp, key, through, time.Now().UTC(), rows); err != nil {
		return fmt.Errorf("pgxstore: record the catch-up of %q through %d: %w", key, through, err)
	}
	return nil
}

// clearKeyed deletes what is recorded under name's pause key, its pause
// and its catch-up mark (Delete, DeleteAll).
func (s *CheckpointStore) clearKeyed(ctx context.Context, tx pgx.Tx, name string) error {
	key := subscriptions.PauseKey(name)
	if _, err := tx.Exec(ctx, s.stmt.clearPause, key); err != nil {
		return fmt.Errorf("clear the pause: %w", err)
	}
	if _, err := tx.Exec(ctx, s.stmt.clearCatchUp, key); err != nil {
		return fmt.Errorf("clear the catch-up mark: %w", err)
	}
	return nil
}
