package subscriptions

import (
	"fmt"
	"strings"
)

// The checkpoint row's lock: the one statement family every path of
// GormCheckpointStore takes a subscriber's checkpoint row with. On
// Postgres a batch locks the row FOR UPDATE SKIP LOCKED (Acquire, and so a
// partition's batch and a retry; AcquireAfter, the same statement in the
// pipelined round trip), or, taking it again after committing its attempt
// record, FOR UPDATE with a bounded wait (renew). Each form reads, in the
// same statement, the position, whether the row exists (a skipped lock of
// a missing row: the row is created and the lock tried again; of a
// present one: another replica holds it), whether the name is paused
// (the batch is then not run, as if held; see Pauser) and the delivery
// marks (see DeliveryMarker). On SQLite the
// batch takes the database's write lock by writing first, then reads the
// same columns.

// lockRowQuery is the lock statement; arg(1) stands for the row's name and
// arg(2) for its pause key (PauseKey); lock is the row's locking clause
// (empty on SQLite, which holds the write lock already). The row is read
// once, locked, for its position and its redelivery mark together: a
// reset committed while the statement waited is seen whole (see
// DeliveryMarker). The name's catch-up mark is only written before the
// name has a row, so any snapshot of it will do.
func lockRowQuery(arg func(n int) string, lock string) string {
	return "SELECT c.position AS position, c.redelivered_through AS redelivered," +
		" EXISTS (SELECT 1 FROM subscriber_checkpoints WHERE subscriber = " + arg(1) + ") AS present," +
		" " + strings.Replace(pausedClause, "?", arg(2), 1) + " AS paused," +
		" " + strings.Replace(catchUpClause, "?", arg(2), 1) + " AS catch_up" +
		" FROM (SELECT 1) AS one LEFT JOIN (SELECT position, redelivered_through FROM subscriber_checkpoints WHERE subscriber = " + arg(1) + " " + lock + ") AS c ON true"
}

// catchUpClause is the catch-up mark of a pause key (one argument), 0
// without one.
const catchUpClause = `COALESCE((SELECT through FROM subscriber_catch_ups WHERE subscriber = ?), 0)`

var (
	// lockRow and relockRow are lockRowQuery for GORM (lockRowArgs).
	lockRow   = lockRowQuery(func(int) string { return "?" }, "FOR UPDATE SKIP LOCKED")
	relockRow = lockRowQuery(func(int) string { return "?" }, "FOR UPDATE")
	// lockRowPgx is lockRowQuery with pgx's placeholders ($1 the name, $2
	// the key), for the pipelined acquire.
	lockRowPgx = lockRowQuery(func(n int) string { return fmt.Sprintf("$%d", n) }, "FOR UPDATE SKIP LOCKED")
	// readLockedRow (SQLite) reads, once the write lock is held, what
	// lockRow reads on Postgres.
	readLockedRow = lockRowQuery(func(int) string { return "?" }, "")
)

// lockRowArgs are the arguments of lockRow, relockRow and readLockedRow,
// in the order of their placeholders in lockRowQuery's text.
func lockRowArgs(subscriber string) []any {
	key := PauseKey(subscriber)
	return []any{subscriber, key, key, subscriber}
}

// lockedRow is what the lock statement reads.
type lockedRow struct {
	Position    *int64 // nil: the row was not locked (held elsewhere, or missing)
	Redelivered *int64 // the row's redelivery mark, read with Position
	Present     bool   // the row exists
	Paused      bool   // the name is paused: the batch is not run
	CatchUp     int64  // the name's catch-up mark
}

// marks are the delivery marks the lock read (see MarkedBatch).
func (r lockedRow) marks() DeliveryMarks {
	m := DeliveryMarks{CatchUpThrough: r.CatchUp}
	if r.Redelivered != nil {
		m.RedeliveredThrough = *r.Redelivered
	}
	return m
}

// relockTimeout bounds relockRow's wait on Postgres: the row is only held
// in the moment another replica looks at a claimed attempt record (see
// checkpoint_gorm_attempts.go), or by a reset.
const relockTimeout = "5s"

// createRow creates a subscriber's checkpoint row at 0 unless it exists:
// on Postgres in a statement of its own before the lock, on SQLite as the
// batch's first statement, which takes the write lock.
const createRow = "INSERT INTO subscriber_checkpoints (subscriber, position, updated_at) VALUES (?, 0, ?) ON CONFLICT (subscriber) DO NOTHING"

// takeWriteLock (SQLite) takes the database's write lock again in a new
// transaction of a batch that holds the row (renew).
const takeWriteLock = "UPDATE subscriber_checkpoints SET position = position WHERE subscriber = ?"
