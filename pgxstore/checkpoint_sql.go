package pgxstore

import (
	"github.com/eventfeed/subscriptions/infrastructure/pgevents"
	"github.com/eventfeed/subscriptions/migrations/schema"
)

// checkpointSQL is a CheckpointStore's statements, each table named in
// the store's schema (schema.Qualified: bare, for the pool's search_path,
// when the store has none). They are rendered once, by newCheckpointSQL
// when the store is built, the same as the GORM Postgres backend's where
// both touch a row, so that replicas of both kinds coordinate on it; a
// search_path store's texts are those of a store without WithSchema.
// Read only after construction, so safe for concurrent use.
type checkpointSQL struct {
	// lockRow locks the row of $1 unless another transaction holds it,
	// reading its position and redelivery mark from the locked row, and
	// reads whether it exists, whether its name (pause key $2) is paused
	// and the name's catch-up mark (see subscriptions.DeliveryMarker).
	lockRow string
	// relockRow locks the row of $1, waiting for it, and reads whether its
	// name (pause key $2) is paused (see renew).
	relockRow string
	// resetRow moves the row of $1 to $2 (creating it) at time $3,
	// keeping the highest checkpoint it had as its redelivery mark.
	resetRow string
	// createRow creates the row of $1 at 0 at time $2, committed on its
	// own: created inside a batch, the uncommitted row would make every
	// other replica's first Acquire wait for that whole batch instead of
	// skipping.
	createRow string
	// commitRow is the compare-and-set of Commit: $1 the new position, $2
	// the time, $3 the row, $4 the position the batch started from, $5
	// the pause key. commitReleasing is commitRow that also releases the
	// batch's attempt claim, holder $6, in the same statement.
	commitRow, commitReleasing string
	// position reads the checkpoint of $1; positions those of $1 (text[]).
	position, positions string
	// lockPosition locks the row of $1, waiting for it, reading its
	// position.
	lockPosition string
	// deleteRow deletes the row of $1.
	deleteRow string
	// pause records pause key $1 at time $2 with reason $3, keeping an
	// earlier record; lockPaused locks the rows of $1 (text[]) in name
	// order, waiting for them, reading their positions; resume lifts the
	// pause of $1, pausedSince reads it.
	pause, lockPaused, resume, pausedSince string
	// startCatchUp records the catch-up mark of key $1 through $2 at time
	// $3 unless the key has one or a row of $4 (text[]) exists.
	startCatchUp string
	// clearPause and clearCatchUp delete what is recorded under pause key
	// $1.
	clearPause, clearCatchUp string

	// The attempt records (checkpoint_attempts.go).

	// beginAttempt is attemptUpsert unless a record of an earlier attempt
	// at the position or another runner's live claim (holder $9, the
	// checkpoint $10) is there, returning what it wrote; readAttempt reads
	// the record of $3 with liveClaim(1, 2).
	beginAttempt, readAttempt string
	// putAttempt is attemptUpsert unless another runner's live claim
	// (holder $9, the checkpoint $10) is there.
	putAttempt string
	// failAttempt writes a failure unclaimed (see failAttemptRow).
	failAttempt string
	// hasAttempt reads whether $1 has a record at $2; attemptPosition
	// reads the position of the record of $1.
	hasAttempt, attemptPosition string
	// clearAttempt deletes the record of $1; clearAttempts those of $1
	// (text[]).
	clearAttempt, clearAttempts string
	// releaseClaim gives up the claim of holder $2 on the record of $1.
	releaseClaim string

	// The partitioned layout (checkpoint_partition.go,
	// checkpoint_repartition.go).

	// seedOf reads the highest position and redelivery mark of the plain
	// name $1 but a retired row ($2); seedRows writes the rows of $1
	// (text[]) at $2, time $3, mark $4 where missing or retired ($5);
	// setPosition sets the row of $3 to $1 at time $2.
	seedOf, seedRows, setPosition string
	// writeRows upserts the rows of $1 (text[]) at $2, time $3, mark $4;
	// createRows creates the missing ones of $1 (text[]) at 0, time $2.
	writeRows, createRows string
	// lockRows locks the rows of $1 (text[]) in name order, waiting.
	lockRows string
	// readLayout reads the rows of $1 (text[]) with the catch-up mark of
	// pause key $2.
	readLayout string

	// The feed, read in the store's transactions when it shares the
	// EventStore's (checkpoint_feed.go): the events after $1 in position
	// order (feedAfterLimit: at most $2), at positions $1 (bigint[]), and
	// in ($1, $2] at most $3.
	feedAfter, feedAfterLimit, feedAt, feedRange string
}

// attemptUpsertInto is the upsert of a whole attempt record with its
// claim into table: $1 subscriber, $2 position, $3 event ID, $4 through,
// $5 attempts, $6 last error, $7 time, $8 holder. Its ON CONFLICT
// clauses name the row by the table's bare name, which Postgres gives
// the target whatever its schema.
func attemptUpsertInto(table string) string {
	return `INSERT INTO ` + table + ` (subscriber, position, event_id, through, attempts, last_error, updated_at, holder, holder_pid, claimed_at)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, pg_backend_pid(), statement_timestamp())
	ON CONFLICT (subscriber) DO UPDATE SET position = excluded.position, event_id = excluded.event_id, through = excluded.through,
		attempts = excluded.attempts, last_error = excluded.last_error, updated_at = excluded.updated_at,
		holder = excluded.holder, holder_pid = excluded.holder_pid, claimed_at = excluded.claimed_at`
}

// newCheckpointSQL renders a CheckpointStore's statements with its tables
// in schemaName ("" for the pool's search_path).
func newCheckpointSQL(schemaName string) checkpointSQL {
	checkpoints := schema.Qualified(schemaName, "subscriber_checkpoints")
	pauses := schema.Qualified(schemaName, "subscriber_pauses")
	catchUps := schema.Qualified(schemaName, "subscriber_catch_ups")
	attempts := schema.Qualified(schemaName, "subscriber_attempts")
	events := schema.Qualified(schemaName, "events")

	// paused is true while the pause key $2 has a row.
	paused := `EXISTS (SELECT 1 FROM ` + pauses + ` WHERE subscriber = $2)`
	commitRow := `UPDATE ` + checkpoints + ` SET position = $1, updated_at = $2
		WHERE subscriber = $3 AND position = $4 AND NOT EXISTS (SELECT 1 FROM ` + pauses + ` WHERE subscriber = $5)`
	selectEvents := "SELECT " + pgevents.Columns + " FROM " + events + " "
	upsert := attemptUpsertInto(attempts)
	return checkpointSQL{
		lockRow: `SELECT c.position, c.redelivered_through,
		EXISTS (SELECT 1 FROM ` + checkpoints + ` WHERE subscriber = $1), ` + paused + `,
		COALESCE((SELECT through FROM ` + catchUps + ` WHERE subscriber = $2), 0)
		FROM (SELECT 1) AS one LEFT JOIN (SELECT position, redelivered_through FROM ` + checkpoints + ` WHERE subscriber = $1 FOR UPDATE SKIP LOCKED) AS c ON true`,
		relockRow: `SELECT (SELECT position FROM ` + checkpoints + ` WHERE subscriber = $1 FOR UPDATE), ` + paused,
		resetRow: `INSERT INTO ` + checkpoints + ` (subscriber, position, updated_at) VALUES ($1, $2, $3)
		ON CONFLICT (subscriber) DO UPDATE SET position = excluded.position, updated_at = excluded.updated_at,
			redelivered_through = GREATEST(subscriber_checkpoints.position, subscriber_checkpoints.redelivered_through)`,
		createRow:       `INSERT INTO ` + checkpoints + ` (subscriber, position, updated_at) VALUES ($1, 0, $2) ON CONFLICT (subscriber) DO NOTHING`,
		commitRow:       commitRow,
		commitReleasing: `WITH released AS (UPDATE ` + attempts + ` SET holder = '' WHERE subscriber = $3 AND holder = $6) ` + commitRow,
		position:        `SELECT position FROM ` + checkpoints + ` WHERE subscriber = $1`,
		positions:       `SELECT subscriber, position FROM ` + checkpoints + ` WHERE subscriber = ANY($1)`,
		lockPosition:    `SELECT position FROM ` + checkpoints + ` WHERE subscriber = $1 FOR UPDATE`,
		deleteRow:       `DELETE FROM ` + checkpoints + ` WHERE subscriber = $1`,
		pause:           `INSERT INTO ` + pauses + ` (subscriber, paused_at, reason) VALUES ($1, $2, $3) ON CONFLICT (subscriber) DO NOTHING`,
		lockPaused:      `SELECT subscriber, position FROM ` + checkpoints + ` WHERE subscriber = ANY($1) ORDER BY subscriber FOR UPDATE`,
		resume:          `DELETE FROM ` + pauses + ` WHERE subscriber = $1`,
		pausedSince:     `SELECT paused_at, reason FROM ` + pauses + ` WHERE subscriber = $1`,
		startCatchUp: `INSERT INTO ` + catchUps + ` (subscriber, through, started_at)
		SELECT $1, $2, $3 WHERE NOT EXISTS (SELECT 1 FROM ` + checkpoints + ` WHERE subscriber = ANY($4))
		ON CONFLICT (subscriber) DO NOTHING`,
		clearPause:   `DELETE FROM ` + pauses + ` WHERE subscriber = $1`,
		clearCatchUp: `DELETE FROM ` + catchUps + ` WHERE subscriber = $1`,

		beginAttempt: upsert + `
			WHERE NOT ((subscriber_attempts.position = excluded.position
				AND (subscriber_attempts.event_id = excluded.event_id OR subscriber_attempts.attempts = 0)) OR ` + liveClaim(9, 10) + `)
			RETURNING attempts`,
		readAttempt: `SELECT position, event_id, through, attempts, last_error, holder, ` + liveClaim(1, 2) + ` FROM ` + attempts + ` WHERE subscriber = $3`,
		putAttempt:  upsert + ` WHERE NOT ` + liveClaim(9, 10),
		failAttempt: `INSERT INTO ` + attempts + ` (subscriber, position, event_id, through, attempts, last_error, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (subscriber) DO UPDATE SET last_error = excluded.last_error, updated_at = excluded.updated_at,
			attempts = CASE WHEN subscriber_attempts.position = excluded.position AND subscriber_attempts.event_id = excluded.event_id
				AND subscriber_attempts.through = excluded.through THEN subscriber_attempts.attempts ELSE excluded.attempts END,
			position = excluded.position, event_id = excluded.event_id, through = excluded.through,
			holder = '', holder_pid = 0, claimed_at = NULL
		WHERE NOT ` + liveClaim(8, 9),
		hasAttempt:      `SELECT EXISTS (SELECT 1 FROM ` + attempts + ` WHERE subscriber = $1 AND position = $2)`,
		attemptPosition: `SELECT position FROM ` + attempts + ` WHERE subscriber = $1`,
		clearAttempt:    `DELETE FROM ` + attempts + ` WHERE subscriber = $1`,
		clearAttempts:   `DELETE FROM ` + attempts + ` WHERE subscriber = ANY($1)`,
		releaseClaim:    `UPDATE ` + attempts + ` SET holder = '' WHERE subscriber = $1 AND holder = $2`,

		seedOf: `SELECT COALESCE(MAX(position), 0), COALESCE(MAX(redelivered_through), 0) FROM ` + checkpoints + ` WHERE subscriber = $1 AND position <> $2`,
		seedRows: `INSERT INTO ` + checkpoints + ` (subscriber, position, updated_at, redelivered_through)
			SELECT unnest($1::text[]), $2, $3, $4 ON CONFLICT (subscriber) DO UPDATE SET position = excluded.position, updated_at = excluded.updated_at, redelivered_through = excluded.redelivered_through
			WHERE subscriber_checkpoints.position = $5`,
		setPosition: `UPDATE ` + checkpoints + ` SET position = $1, updated_at = $2 WHERE subscriber = $3`,
		writeRows: `INSERT INTO ` + checkpoints + ` (subscriber, position, updated_at, redelivered_through)
				SELECT unnest($1::text[]), $2, $3, $4
				ON CONFLICT (subscriber) DO UPDATE SET position = excluded.position, updated_at = excluded.updated_at, redelivered_through = excluded.redelivered_through`,
		createRows: `INSERT INTO ` + checkpoints + ` (subscriber, position, updated_at)
		SELECT unnest($1::text[]), 0, $2 ON CONFLICT (subscriber) DO NOTHING`,
		lockRows: `SELECT subscriber FROM ` + checkpoints + ` WHERE subscriber = ANY($1) ORDER BY subscriber FOR UPDATE`,
		readLayout: `SELECT c.subscriber, c.position, c.redelivered_through,
			COALESCE((SELECT through FROM ` + catchUps + ` WHERE subscriber = $2), 0)
		FROM ` + checkpoints + ` AS c WHERE c.subscriber = ANY($1)`,

		feedAfter:      selectEvents + "WHERE position > $1 ORDER BY position",
		feedAfterLimit: selectEvents + "WHERE position > $1 ORDER BY position LIMIT $2",
		feedAt:         selectEvents + "WHERE position = ANY($1::bigint[]) ORDER BY position",
		feedRange:      selectEvents + "WHERE position > $1 AND position <= $2 ORDER BY position LIMIT $3",
	}
}
