-- +goose Up
-- The tables of github.com/eventfeed/subscriptions, created, or taken over
-- in place from the original module. Every statement is idempotent (IF NOT EXISTS, ON CONFLICT
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

-- Poison events (subscriptions.GormParkingLot). The row key is key, a
-- SHA-256 digest of (subscriber, NUL, event ID), and rows are listed
-- through subscriber_key, a digest of the subscriber name: a B-tree entry
-- holds at most about 2.7 kB, and a subscriber name and an event ID may
-- each be up to 2 kB, so a primary key over the two columns would refuse
-- long IDs. The trigger computes the digests, so a row written through the
-- documented model (subscriptions.GormParkedEventModel, which has no key
-- columns) is complete; the library computes the same digests in Go to
-- find rows by key.
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

-- Takeover of the table the original module created (GORM AutoMigrate of
-- GormParkedEventModel: no key columns, primary key (subscriber, event_id),
-- all but the key nullable), in place: add the digest columns and the
-- trigger, fill the digests of existing rows, move the primary key to key.
-- On a table this file created, each statement finds its work done. No
-- row's data is dropped or changed.
ALTER TABLE parked_events ADD COLUMN IF NOT EXISTS key bytea;
ALTER TABLE parked_events ADD COLUMN IF NOT EXISTS subscriber_key bytea;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION parked_events_keys() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	NEW.key := sha256(convert_to(NEW.subscriber, 'UTF8') || '\x00'::bytea || convert_to(NEW.event_id, 'UTF8'));
	NEW.subscriber_key := sha256(convert_to(NEW.subscriber, 'UTF8'));
	RETURN NEW;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass('parked_events') AND tgname = 'parked_events_keys') THEN
		CREATE TRIGGER parked_events_keys BEFORE INSERT OR UPDATE OF subscriber, event_id ON parked_events
			FOR EACH ROW EXECUTE FUNCTION parked_events_keys();
	END IF;
END
$$;
-- +goose StatementEnd

UPDATE parked_events
	SET key = sha256(convert_to(subscriber, 'UTF8') || '\x00'::bytea || convert_to(event_id, 'UTF8')),
		subscriber_key = sha256(convert_to(subscriber, 'UTF8'))
	WHERE key IS NULL OR subscriber_key IS NULL;

-- +goose StatementBegin
DO $$
DECLARE pk name;
BEGIN
	IF NOT EXISTS (
		SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		WHERE i.indrelid = to_regclass('parked_events') AND i.indisprimary AND i.indnatts = 1 AND a.attname = 'key'
	) THEN
		SELECT conname INTO pk FROM pg_constraint WHERE conrelid = to_regclass('parked_events') AND contype = 'p';
		IF pk IS NOT NULL THEN
			EXECUTE format('ALTER TABLE parked_events DROP CONSTRAINT %I', pk);
		END IF;
		ALTER TABLE parked_events ALTER COLUMN key SET NOT NULL, ALTER COLUMN subscriber_key SET NOT NULL;
		ALTER TABLE parked_events ADD PRIMARY KEY (key);
	END IF;
END
$$;
-- +goose StatementEnd

CREATE INDEX IF NOT EXISTS idx_parked_events_position ON parked_events (subscriber_key, position);

INSERT INTO subscriptions_schema_migrations (version) VALUES (1) ON CONFLICT DO NOTHING;
