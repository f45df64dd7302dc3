-- +goose Up
-- What a handler's delivery is (subscriptions.DeliveryFrom), recorded with
-- the checkpoints so that every replica, partition and restart knows it.
-- redelivered_through: a reset (ResetCheckpoint, ResetCheckpointWith)
-- keeps here the highest checkpoint the row had before, in the reset's
-- transaction; events up to it are re-deliveries. subscriber_catch_ups: a
-- name's first start (WithFirstRunCatchUp) records the feed head, up to
-- which events are its catch-up. Batches read both when they lock their
-- checkpoint row. Postgres adds a column with a constant default without
-- rewriting the table; the ALTER gives up after five seconds rather than
-- stall the traffic queued behind its lock (apply again later).
SET LOCAL lock_timeout = '5s';
ALTER TABLE subscriber_checkpoints ADD COLUMN IF NOT EXISTS redelivered_through bigint NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS subscriber_catch_ups (
	subscriber text        NOT NULL PRIMARY KEY,
	through    bigint      NOT NULL,
	started_at timestamptz NOT NULL
);

INSERT INTO subscriptions_schema_migrations (version) VALUES (6) ON CONFLICT DO NOTHING;
