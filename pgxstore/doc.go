// Package pgxstore is a Postgres backend of package subscriptions written
// on pgx (github.com/jackc/pgx/v5) alone: a checkpoint store
// (NewCheckpointStore), a managed parking lot (NewParkingLot) and an
// event store (NewEventStore), all on one *pgxpool.Pool, with no GORM in
// their code. A handler gets the batch transaction as a pgx.Tx
// (TxFromContext), which sqlc's pgx/v5 generated New(db DBTX) accepts, so
// its projection writes commit with the checkpoint: exactly-once, as the
// package documentation of subscriptions describes. An application's own
// transaction appends events with its state change (EventStore.AppendTx).
//
// The backend uses the same tables, migrations (package
// migrations/schema) and locks as the GORM Postgres backend of package
// subscriptions and infrastructure.GormEventStore: a database moves between
// the two in place, both ways, and replicas of both kinds coordinate on one
// subscriber name during a rolling switch. It reaches package
// subscriptions through its exported seam only (CheckpointStore, Batch,
// ParkingLot and their optional capabilities, listed in the package
// documentation of subscriptions, "Other backends"), which makes it the
// example of a backend written outside that package.
//
// # Connections
//
// A batch holds one connection of the pool for its life and never waits
// for a second; an append, a parking-lot call and a checkpoint read each
// hold one for their statement or transaction; AppendTx uses the
// caller's. The pool rule of package
// subscriptions (Connections) applies as it is.
package pgxstore
