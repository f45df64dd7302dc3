-- +goose Up
-- Subscriber names paused everywhere (subscriptions.Subscriber.Pause): a
-- row per paused name (a partitioned subscriber's name, for all its
-- partitions). Every batch of the name reads it when it locks its
-- checkpoint row, and its commit refuses to move the checkpoint while the
-- row is there, so that nothing of the name is handled, by any replica,
-- once Pause has returned; Resume deletes the row.
CREATE TABLE IF NOT EXISTS subscriber_pauses (
	subscriber text        NOT NULL PRIMARY KEY,
	paused_at  timestamptz NOT NULL,
	reason     text        NOT NULL DEFAULT ''
);

INSERT INTO subscriptions_schema_migrations (version) VALUES (5) ON CONFLICT DO NOTHING;
