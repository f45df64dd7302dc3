-- +goose Up
-- Attempt claims (see the Postgres file) keep other processes' replicas
-- out of a checkpoint in the moment a batch takes it again. One process
-- serves a SQLite database, whose batches of a subscriber are serialized
-- in that process: SQLite needs no claim, and the file only records its
-- version, so that both engines keep the same numbers.
INSERT INTO subscriptions_schema_migrations (version) VALUES (4) ON CONFLICT DO NOTHING;
