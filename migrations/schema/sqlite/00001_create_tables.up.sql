-- +goose Up
-- The tables of github.com/eventfeed/subscriptions, as its constructors
-- create them. Every statement is idempotent (IF NOT EXISTS, ON CONFLICT
-- DO NOTHING), so this file may run on a database that the library, or
-- any other migration tool, has already set up. Each file records its
-- version in subscriptions_schema_migrations, whatever tool applies it:
-- that is how the library checks a schema it may not change.

CREATE TABLE IF NOT EXISTS subscriptions_schema_migrations (
	version    integer  NOT NULL PRIMARY KEY,
	applied_at datetime NOT NULL DEFAULT CURRENT_TIMESTAMP
);

-- The event store's table (infrastructure.GormEventStore). Positions are
-- MAX(position)+1 inside the store's write transaction.
CREATE TABLE IF NOT EXISTS events (
	id             text     NOT NULL PRIMARY KEY,
	aggregate_id   text     NOT NULL,
	event_type     text     NOT NULL,
	sequence_no    integer  NOT NULL,
	transaction_id text     NOT NULL DEFAULT '',
	position       integer  NOT NULL,
	payload        text,
	metadata       text,
	created_at     datetime NOT NULL,
	CONSTRAINT events_aggregate_sequence_key UNIQUE (aggregate_id, sequence_no),
	CONSTRAINT events_position_key UNIQUE (position)
);
CREATE INDEX IF NOT EXISTS idx_events_transaction_id ON events (transaction_id);

-- One row per subscriber (subscriptions.GormCheckpointStore).
CREATE TABLE IF NOT EXISTS subscriber_checkpoints (
	subscriber text     NOT NULL PRIMARY KEY,
	position   integer  NOT NULL,
	updated_at datetime
);

-- Poison events (subscriptions.GormParkingLot). SQLite has no index entry
-- size limit, so the key is the two columns themselves.
CREATE TABLE IF NOT EXISTS parked_events (
	subscriber text     NOT NULL,
	event_id   text     NOT NULL,
	event_type text     NOT NULL DEFAULT '',
	position   integer  NOT NULL DEFAULT 0,
	error      text     NOT NULL DEFAULT '',
	attempts   integer  NOT NULL DEFAULT 0,
	parked_at  datetime,
	PRIMARY KEY (subscriber, event_id)
);
CREATE INDEX IF NOT EXISTS idx_parked_events_position ON parked_events (subscriber, position);

INSERT INTO subscriptions_schema_migrations (version) VALUES (1) ON CONFLICT DO NOTHING;
