package subscriptions

import (
	"fmt"

	"github.com/eventfeed/subscriptions/internal/dialect"
	"github.com/eventfeed/subscriptions/internal/eventrow"
)

// checkpointSQL is a GormCheckpointStore's fixed statements, rendered
// once by its constructor with its tables (gormTables) and its dialect's
// SQL. It is immutable.
type checkpointSQL struct {
	gormTables
	// lockRow, relockRow and readLockedRow are lockRowQuery for GORM
	// (lockRowArgs); lockRowPgx is it with pgx's placeholders ($1 the
	// name, $2 the key), for the pipelined acquire.
	lockRow, relockRow, readLockedRow, lockRowPgx string
	// createRow creates a subscriber's checkpoint row at 0 unless it
	// exists: on Postgres in a statement of its own before the lock, on
	// SQLite as the batch's first statement, which takes the write lock.
	createRow string
	// takeWriteLock (SQLite) takes the database's write lock again in a
	// new transaction of a batch that holds the row (renew).
	takeWriteLock string
	// resetRow is the checkpoint write of every reset (see resetRowQuery).
	resetRow string
	// deleteRow deletes a subscriber's checkpoint row; position reads
	// its position.
	deleteRow, position string
	// catchUp is catchUpClause on one ? (the pause key).
	catchUp string
	// commitUpdate and commitUpdateClaim are Commit's compare-and-set
	// (see commitStatements); releaseClaim gives up a batch's attempt
	// claim (releaseClaimQuery).
	commitUpdate, commitUpdateClaim statement
	releaseClaim                    string
	// attemptUpsert writes a whole attempt record (see attemptUpsertQuery).
	attemptUpsert string
	// pipelinedAttempt and pipelinedFeed are the reads of the pipelined
	// acquire (see sendAcquireBatch).
	pipelinedAttempt, pipelinedFeed string
}

// newCheckpointSQL renders the statements of a store on the tables t in
// the dialect d.
func newCheckpointSQL(t gormTables, d *dialect.Dialect) *checkpointSQL {
	gormArg := func(int) string { return "?" }
	q := &checkpointSQL{
		gormTables:       t,
		lockRow:          lockRowQuery(t, gormArg, "FOR UPDATE SKIP LOCKED"),
		relockRow:        lockRowQuery(t, gormArg, "FOR UPDATE"),
		readLockedRow:    lockRowQuery(t, gormArg, ""),
		lockRowPgx:       lockRowQuery(t, func(n int) string { return fmt.Sprintf("$%d", n) }, "FOR UPDATE SKIP LOCKED"),
		createRow:        "INSERT INTO " + t.checkpoints + " (subscriber, position, updated_at) VALUES (?, 0, ?) ON CONFLICT (subscriber) DO NOTHING",
		takeWriteLock:    "UPDATE " + t.checkpoints + " SET position = position WHERE subscriber = ?",
		resetRow:         resetRowQuery(t),
		deleteRow:        "DELETE FROM " + t.checkpoints + " WHERE subscriber = ?",
		position:         "SELECT position FROM " + t.checkpoints + " WHERE subscriber = ?",
		catchUp:          catchUpClause(t, "?"),
		attemptUpsert:    attemptUpsertQuery(t, d),
		releaseClaim:     releaseClaimQuery(t),
		pipelinedAttempt: "SELECT position FROM " + t.attempts + " WHERE subscriber = $1",
		pipelinedFeed:    eventrow.SelectFrom(t.events) + "WHERE position > $1 ORDER BY position LIMIT $2",
	}
	q.commitUpdate, q.commitUpdateClaim = commitStatements(t)
	return q
}
