-- +goose Up
-- ParkedEvent.AggregateID (subscriptions.GormParkingLot, ManagedParkingLot).
-- Postgres adds a column with a constant default without rewriting the
-- table; the ALTER still waits for an exclusive lock, so it gives up after
-- five seconds rather than stall the application's traffic queued behind
-- it (apply again later).
SET LOCAL lock_timeout = '5s';
ALTER TABLE parked_events ADD COLUMN IF NOT EXISTS aggregate_id text NOT NULL DEFAULT '';

INSERT INTO subscriptions_schema_migrations (version) VALUES (2) ON CONFLICT DO NOTHING;
