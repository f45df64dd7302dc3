package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/migrations/schema"
)

// appendLockKey is the key GormEventStore takes for appends to the events
// table of db's search_path (see NewGormEventStore).
func appendLockKey(ctx context.Context, db *gorm.DB) (int64, error) {
	var qualified string
	err := db.WithContext(ctx).Raw(`SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = to_regclass('events')`).Scan(&qualified).Error
	if err != nil || qualified == "" {
		return 0, fmt.Errorf("resolve the events table: %v", err)
	}
	return schema.LockKey("append", qualified), nil
}

// previousAppend reproduces the store's Postgres append as it was before
// coalescing (issue 19), statement for statement, on the same table and
// under the same lock, so that it is measured beside the library in the
// same run: [BEGIN; pg_advisory_xact_lock; read the aggregate's version
// and the feed head], then, with positions and sequence numbers computed
// in the client, [INSERT; pg_notify; COMMIT]. Each call is its own
// transaction. It skips the library's input validation (the events are
// the benchmark's own) and appends with expectedVersion -1.
func previousAppend(ctx context.Context, db *gorm.DB, lockKey int64, aggregate string, events []domain.EventEnvelope[any]) error {
	return onPgxConn(ctx, db, func(c *pgx.Conn) error {
		first := &pgx.Batch{}
		first.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
		first.Queue("SELECT pg_advisory_xact_lock($1)", lockKey)
		var version, head int64
		first.Queue(`SELECT
			(SELECT COALESCE(MAX(sequence_no), 0) FROM events WHERE aggregate_id = $1),
			(SELECT COALESCE(MAX(position), 0) FROM events)`, aggregate).QueryRow(func(row pgx.Row) error {
			return row.Scan(&version, &head)
		})
		if err := c.SendBatch(ctx, first).Close(); err != nil {
			return err
		}
		rows := make([][]any, len(events))
		for i, e := range events {
			payload, metadata, err := eventJSON(e)
			if err != nil {
				return err
			}
			rows[i] = []any{e.ID, aggregate, e.EventType, version + int64(i+1), e.TransactionID, head + int64(i+1),
				payload, metadata, e.Created.UTC().Truncate(time.Microsecond)}
		}
		sql, args := insertValues("INSERT INTO events (id, aggregate_id, event_type, sequence_no, transaction_id, position, payload, metadata, created_at) VALUES ", rows)
		second := &pgx.Batch{}
		second.Queue(sql, args...)
		second.Queue("SELECT pg_notify($1, '')", infrastructure.PostgresNotifyChannel)
		second.Queue("COMMIT")
		return c.SendBatch(ctx, second).Close()
	})
}
