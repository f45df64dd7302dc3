-- +goose Up
-- Subscriber names paused everywhere; see the Postgres file.
CREATE TABLE IF NOT EXISTS subscriber_pauses (
	subscriber text     NOT NULL PRIMARY KEY,
	paused_at  datetime NOT NULL,
	reason     text     NOT NULL DEFAULT ''
);

INSERT INTO subscriptions_schema_migrations (version) VALUES (5) ON CONFLICT DO NOTHING;
