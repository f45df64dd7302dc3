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
// present one: another replica holds it) and whether the name is paused
// (the batch is then not run, as if held; see Pauser). On SQLite the
// batch takes the database's write lock by writing first, then reads the
// same columns.

// lockRowQuery is the lock statement; arg(1) stands for the row's name and
// arg(2) for its pause key (PauseKey), wait for the blocking form.
func lockRowQuery(arg func(n int) string, wait bool) string {
	lock := "FOR UPDATE SKIP LOCKED"
	if wait {
		lock = "FOR UPDATE"
	}
	return "SELECT (SELECT position FROM subscriber_checkpoints WHERE subscriber = " + arg(1) + " " + lock + ") AS position," +
		" EXISTS (SELECT 1 FROM subscriber_checkpoints WHERE subscriber = " + arg(1) + ") AS present," +
		" " + strings.Replace(pausedClause, "?", arg(2), 1) + " AS paused"
}

var (
	// lockRow and relockRow are lockRowQuery for GORM (lockRowArgs).
	lockRow   = lockRowQuery(func(int) string { return "?" }, false)
	relockRow = lockRowQuery(func(int) string { return "?" }, true)
	// lockRowPgx is lockRowQuery with pgx's placeholders ($1 the name, $2
	// the key), for the pipelined acquire.
	lockRowPgx = lockRowQuery(func(n int) string { return fmt.Sprintf("$%d", n) }, false)
)

// lockRowArgs are lockRow's and relockRow's arguments.
func lockRowArgs(subscriber string) []any {
	return []any{subscriber, subscriber, PauseKey(subscriber)}
}

// lockedRow is what the lock statement reads.
type lockedRow struct {
	Position *int64 // nil: the row was not locked (held elsewhere, or missing)
	Present  bool   // the row exists
	Paused   bool   // the name is paused: the batch is not run
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

// readLockedRow (SQLite) reads, once the write lock is held, what lockRow
// reads on Postgres; its arguments are lockRowArgs'.
var readLockedRow = "SELECT (SELECT position FROM subscriber_checkpoints WHERE subscriber = ?) AS position," +
	" EXISTS (SELECT 1 FROM subscriber_checkpoints WHERE subscriber = ?) AS present, " + pausedClause + " AS paused"
