-- +goose Up
-- Who is making the attempt a subscriber_attempts row records
-- (subscriptions.GormCheckpointStore). A batch writes its attempt record on
-- its own connection, committed, and then locks the checkpoint row again:
-- nothing ever waits for a second connection while it holds one. In the
-- moment between the two, another replica that takes the row lock finds
-- the record claimed (holder: the attempting runner, holder_pid: its
-- server process, claimed_at: the server's clock) and skips the
-- checkpoint as if it were locked, while the claim is live: its holder's
-- server process is still there and the claim is young. Postgres adds
-- columns with constant defaults without rewriting the table; the ALTER
-- gives up after five seconds rather than stall the traffic queued behind
-- its lock (apply again later).
SET LOCAL lock_timeout = '5s';
ALTER TABLE subscriber_attempts ADD COLUMN IF NOT EXISTS holder text NOT NULL DEFAULT '';
ALTER TABLE subscriber_attempts ADD COLUMN IF NOT EXISTS holder_pid integer NOT NULL DEFAULT 0;
ALTER TABLE subscriber_attempts ADD COLUMN IF NOT EXISTS claimed_at timestamptz;

INSERT INTO subscriptions_schema_migrations (version) VALUES (4) ON CONFLICT DO NOTHING;
