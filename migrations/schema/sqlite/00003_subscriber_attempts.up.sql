-- +goose Up
-- The durable attempt count of the event a subscriber is retrying
-- (subscriptions.GormCheckpointStore); see the Postgres file for the
-- columns. On SQLite it is committed by the batch itself before the attempt
-- runs (the batch holds the write lock, so no other connection could).
CREATE TABLE IF NOT EXISTS subscriber_attempts (
	subscriber text     NOT NULL PRIMARY KEY,
	position   integer  NOT NULL,
	event_id   text     NOT NULL,
	through    integer  NOT NULL,
	attempts   integer  NOT NULL,
	last_error text     NOT NULL DEFAULT '',
	updated_at datetime
);

INSERT INTO subscriptions_schema_migrations (version) VALUES (3) ON CONFLICT DO NOTHING;
