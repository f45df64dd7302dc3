package subscriptions

import "github.com/eventfeed/subscriptions/internal/sqlschema"

// The parked_events schema, per engine, in one place: the table as this
// module creates it, and the in-place takeover of the table the original
// module created with GORM AutoMigrate of GormParkedEventModel (columns
// subscriber, event_id, event_type, position, error, attempts, parked_at;
// primary key (subscriber, event_id); all but the key nullable).
//
// SQLite keeps the original's primary key on the columns (SQLite has no
// entry size limit), so the original's table is already the current one.
//
// On Postgres the row key is key, a SHA-256 digest of (subscriber, NUL,
// event ID), and rows are listed through subscriber_key, a digest of the
// subscriber name: a B-tree entry holds at most ~2.7 kB, and a subscriber
// name and an event ID may each be up to 2 kB, so the original's primary
// key over the two columns would refuse long IDs. The digests are computed
// by a trigger (parked_events_keys), so a row written through the
// documented model, which has no key columns, is complete and is one the
// library reads. The library computes the same digests in Go
// (parkedRowKey, subscriberKey) to find rows by key.
//
// The takeover (parkedTakeoverPostgres) adds the two columns, the trigger,
// fills the digests of existing rows, moves the primary key from
// (subscriber, event_id) to key, and adds the listing index. Every
// statement is idempotent, runs under the migration advisory lock
// (internal/sqlschema), and never drops or changes a row's data.
const (
	parkedTablePostgres = `CREATE TABLE IF NOT EXISTS parked_events (
		key            bytea       NOT NULL PRIMARY KEY,
		subscriber_key bytea       NOT NULL,
		subscriber     text        NOT NULL,
		event_id       text        NOT NULL,
		event_type     text        NOT NULL DEFAULT '',
		position       bigint      NOT NULL DEFAULT 0,
		error          text        NOT NULL DEFAULT '',
		attempts       integer     NOT NULL DEFAULT 0,
		parked_at      timestamptz,
		aggregate_id   text        NOT NULL DEFAULT ''
	)`

	parkedKeysFunctionPostgres = `CREATE OR REPLACE FUNCTION parked_events_keys() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			NEW.key := sha256(convert_to(NEW.subscriber, 'UTF8') || '\x00'::bytea || convert_to(NEW.event_id, 'UTF8'));
			NEW.subscriber_key := sha256(convert_to(NEW.subscriber, 'UTF8'));
			RETURN NEW;
		END
	$$`

	parkedKeysTriggerPostgres = `DO $$
		BEGIN
			IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass('parked_events') AND tgname = 'parked_events_keys') THEN
				CREATE TRIGGER parked_events_keys BEFORE INSERT OR UPDATE OF subscriber, event_id ON parked_events
					FOR EACH ROW EXECUTE FUNCTION parked_events_keys();
			END IF;
		END
	$$`

	parkedBackfillPostgres = `UPDATE parked_events
		SET key = sha256(convert_to(subscriber, 'UTF8') || '\x00'::bytea || convert_to(event_id, 'UTF8')),
			subscriber_key = sha256(convert_to(subscriber, 'UTF8'))
		WHERE key IS NULL OR subscriber_key IS NULL`

	// parkedPrimaryKeyPostgres moves the primary key to key when it is
	// anywhere else (the original's (subscriber, event_id)).
	parkedPrimaryKeyPostgres = `DO $$
		DECLARE pk name;
		BEGIN
			IF NOT EXISTS (` + parkedKeyIsPrimary + `) THEN
				SELECT conname INTO pk FROM pg_constraint WHERE conrelid = to_regclass('parked_events') AND contype = 'p';
				IF pk IS NOT NULL THEN
					EXECUTE format('ALTER TABLE parked_events DROP CONSTRAINT %I', pk);
				END IF;
				ALTER TABLE parked_events ALTER COLUMN key SET NOT NULL, ALTER COLUMN subscriber_key SET NOT NULL;
				ALTER TABLE parked_events ADD PRIMARY KEY (key);
			END IF;
		END
	$$`

	parkedKeyIsPrimary = `SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		WHERE i.indrelid = to_regclass('parked_events') AND i.indisprimary AND i.indnatts = 1 AND a.attname = 'key'`

	parkedIndexPostgres = `CREATE INDEX IF NOT EXISTS idx_parked_events_position ON parked_events (subscriber_key, position)`

	// parkedCurrentPostgres is true when the table needs no takeover.
	parkedCurrentPostgres = `SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass('parked_events') AND tgname = 'parked_events_keys')
		AND EXISTS (` + parkedKeyIsPrimary + `)`

	parkedTableSQLite = `CREATE TABLE IF NOT EXISTS parked_events (
		subscriber text     NOT NULL,
		event_id   text     NOT NULL,
		event_type text     NOT NULL DEFAULT '',
		position   integer  NOT NULL DEFAULT 0,
		error      text     NOT NULL DEFAULT '',
		attempts   integer  NOT NULL DEFAULT 0,
		parked_at  datetime,
		aggregate_id text NOT NULL DEFAULT '',
		PRIMARY KEY (subscriber, event_id)
	)`

	parkedIndexSQLite = `CREATE INDEX IF NOT EXISTS idx_parked_events_position ON parked_events (subscriber, position)`
)

// parkedTakeoverPostgres brings an existing parked_events table (the
// original's, or this module's before the trigger) to the current shape.
var parkedTakeoverPostgres = []string{
	`ALTER TABLE parked_events ADD COLUMN IF NOT EXISTS key bytea`,
	`ALTER TABLE parked_events ADD COLUMN IF NOT EXISTS subscriber_key bytea`,
	parkedKeysFunctionPostgres,
	parkedKeysTriggerPostgres,
	parkedBackfillPostgres,
	parkedPrimaryKeyPostgres,
	parkedIndexPostgres,
}

var parkedObjects = sqlschema.Objects{
	Names:           []string{"parked_events", "idx_parked_events_position"},
	Postgres:        append([]string{parkedTablePostgres}, parkedTakeoverPostgres...),
	PostgresCurrent: parkedCurrentPostgres,
	SQLite:          []string{parkedTableSQLite, parkedIndexSQLite},
}
