// Package infrastructure provides the event stores of this module: an
// in-memory MemoryStore for tests and single-process use, and a
// GormEventStore for Postgres and SQLite.
//
// Both implement domain.EventStore, including the global ordered feed
// (ReadAfter) that background subscribers treat as a durable queue. The
// feed's one hard rule is that a position is never returned while an event
// with a smaller position can still commit; see GormEventStore for how
// Postgres is made to honour it.
package infrastructure
