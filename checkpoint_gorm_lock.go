package subscriptions

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

// lockRowQuery is the lock statement on the tables t; arg(1) stands for
// the row's name and arg(2) for its pause key (PauseKey); lock is the
// row's locking clause (empty on SQLite, which holds the write lock
// already). The row is read once, locked, for its position and its
// redelivery mark together: a reset committed while the statement waited
// is seen whole (see DeliveryMarker). The name's catch-up mark is only
// written before the name has a row, so any snapshot of it will do.
func lockRowQuery(t gormTables, arg func(n int) string, lock string) string {
	return "SELECT c.position AS position, c.redelivered_through AS redelivered," +
		" EXISTS (SELECT 1 FROM " + t.checkpoints + " WHERE subscriber = " + arg(1) + ") AS present," +
		" " + pausedClause(t, arg(2)) + " AS paused," +
		" " + catchUpClause(t, arg(2)) + " AS catch_up" +
		" FROM (SELECT 1) AS one LEFT JOIN (SELECT position, redelivered_through FROM " + t.checkpoints + " WHERE subscriber = " + arg(1) + " " + lock + ") AS c ON true"
}

// catchUpClause is the catch-up mark of a pause key (the placeholder
// arg), 0 without one.
func catchUpClause(t gormTables, arg string) string {
	return `COALESCE((SELECT through FROM ` + t.catchUps + ` WHERE subscriber = ` + arg + `), 0)`
}

// lockRowArgs are the arguments of the GORM forms of lockRowQuery
// (checkpointSQL), in the order of their placeholders in its text.
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
