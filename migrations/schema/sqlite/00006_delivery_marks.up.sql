-- +goose Up
-- Re-deliveries and catch-ups (subscriptions.DeliveryFrom); see the
-- Postgres file. SQLite has no ADD COLUMN IF NOT EXISTS: migrations.Migrate
-- skips the statement when the column is already there.
ALTER TABLE subscriber_checkpoints ADD COLUMN redelivered_through integer NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS subscriber_catch_ups (
	subscriber text     NOT NULL PRIMARY KEY,
	through    integer  NOT NULL,
	started_at datetime NOT NULL
);

INSERT INTO subscriptions_schema_migrations (version) VALUES (6) ON CONFLICT DO NOTHING;
