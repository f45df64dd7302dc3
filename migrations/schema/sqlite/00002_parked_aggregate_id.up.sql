-- +goose Up
-- ParkedEvent.AggregateID (subscriptions.GormParkingLot, ManagedParkingLot).
-- SQLite has no ADD COLUMN IF NOT EXISTS: this is the one statement of the
-- files that is not idempotent. migrations.Migrate skips it when the column
-- is already there (a table created by a build of this module that added
-- the column itself); a migration tool applies it as it is, which is right
-- for every database that does not record version 2.
ALTER TABLE parked_events ADD COLUMN aggregate_id text NOT NULL DEFAULT '';

INSERT INTO subscriptions_schema_migrations (version) VALUES (2) ON CONFLICT DO NOTHING;
