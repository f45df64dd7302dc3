-- +goose Up
-- The durable attempt count of the event a subscriber is retrying
-- (subscriptions.GormCheckpointStore): one row per checkpoint row, written
-- in a statement of its own, committed before the attempt runs, by the
-- replica that holds the checkpoint row's lock. It is a table of its own
-- because that lock is held by the batch transaction for the whole
-- attempt: a column of the locked row could not be written and committed
-- before the handler runs. position is the checkpoint the attempt started
-- from, event_id the first event attempted, through the last; a row whose
-- position is no longer the checkpoint's is void.
CREATE TABLE IF NOT EXISTS subscriber_attempts (
	subscriber text        NOT NULL PRIMARY KEY,
	position   bigint      NOT NULL,
	event_id   text        NOT NULL,
	through    bigint      NOT NULL,
	attempts   integer     NOT NULL,
	last_error text        NOT NULL DEFAULT '',
	updated_at timestamptz
);

INSERT INTO subscriptions_schema_migrations (version) VALUES (3) ON CONFLICT DO NOTHING;
