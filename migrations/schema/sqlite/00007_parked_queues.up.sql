-- +goose Up
-- Per-aggregate queues of parked events; see the Postgres file. As for
-- 00002, migrations.Migrate skips the ADD COLUMN when the column is there
-- (SQLite has no ADD COLUMN IF NOT EXISTS).
ALTER TABLE parked_events ADD COLUMN held_by text NOT NULL DEFAULT '';
CREATE INDEX IF NOT EXISTS idx_parked_events_heads ON parked_events (subscriber, aggregate_id, position) WHERE held_by = '';

INSERT INTO subscriptions_schema_migrations (version) VALUES (7) ON CONFLICT DO NOTHING;
