-- +goose Up
-- The tables of github.com/eventfeed/subscriptions, as its constructors
-- create them. Every statement is idempotent (IF NOT EXISTS, ON CONFLICT
-- DO NOTHING), so this file may run on a database that the library, or
-- any other migration tool, has already set up. Each file records its
-- version in subscriptions_schema_migrations, whatever tool applies it:
-- that is how the library checks a schema it may not change.

CREATE TABLE IF NOT EXISTS subscriptions_schema_migrations (
	version    bigint      NOT NULL PRIMARY KEY,
	applied_at timestamptz NOT NULL DEFAULT now()
);

-- The event store's table (infrastructure.GormEventStore). Positions are
-- assigned by the store under an advisory lock, not by a sequence.
CREATE TABLE IF NOT EXISTS events (
	id             text        NOT NULL PRIMARY KEY,
	aggregate_id   text        NOT NULL,
	event_type     text        NOT NULL,
	sequence_no    bigint      NOT NULL,
	transaction_id text        NOT NULL DEFAULT '',
	position       bigint      NOT NULL,
	payload        jsonb,
	metadata       jsonb,
	created_at     timestamptz NOT NULL,
	CONSTRAINT events_aggregate_sequence_key UNIQUE (aggregate_id, sequence_no),
	CONSTRAINT events_position_key UNIQUE (position)
);
CREATE INDEX IF NOT EXISTS idx_events_transaction_id ON events (transaction_id);

-- One row per subscriber (subscriptions.GormCheckpointStore).
CREATE TABLE IF NOT EXISTS subscriber_checkpoints (
	subscriber text        NOT NULL PRIMARY KEY,
	position   bigint      NOT NULL,
	updated_at timestamptz
);

-- Poison events (subscriptions.GormParkingLot). The key is a SHA-256
-- digest of (subscriber, event ID) computed by the library, not a primary
-- key over the two columns: a B-tree entry holds at most about 2.7 kB, and
-- a subscriber name and an event ID may each be up to 2 kB.
CREATE TABLE IF NOT EXISTS parked_events (
	key            bytea       NOT NULL PRIMARY KEY,
	subscriber_key bytea       NOT NULL,
	subscriber     text        NOT NULL,
	event_id       text        NOT NULL,
	event_type     text        NOT NULL DEFAULT '',
	position       bigint      NOT NULL DEFAULT 0,
	error          text        NOT NULL DEFAULT '',
	attempts       integer     NOT NULL DEFAULT 0,
	parked_at      timestamptz
);
CREATE INDEX IF NOT EXISTS idx_parked_events_position ON parked_events (subscriber_key, position);

INSERT INTO subscriptions_schema_migrations (version) VALUES (1) ON CONFLICT DO NOTHING;
