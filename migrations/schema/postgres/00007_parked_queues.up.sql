-- +goose Up
-- Per-aggregate queues of parked events (subscriptions.WithOrderedParking,
-- OrderedParkingLot). held_by is empty for an entry parked for its own
-- failure, and for an entry held behind its aggregate's queue the event
-- it was held behind (the queue's first entry then, which is never held).
-- The partial index finds each queue's first entry: one indexed lookup. A
-- column with a constant default is added without rewriting the table;
-- the ALTER gives up after five seconds rather than stall the traffic
-- queued behind its lock (apply again later).
SET LOCAL lock_timeout = '5s';
ALTER TABLE parked_events ADD COLUMN IF NOT EXISTS held_by text NOT NULL DEFAULT '';
CREATE INDEX IF NOT EXISTS idx_parked_events_heads ON parked_events (subscriber_key, aggregate_id, position) WHERE held_by = '';

INSERT INTO subscriptions_schema_migrations (version) VALUES (7) ON CONFLICT DO NOTHING;
