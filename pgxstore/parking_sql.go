package pgxstore

import "github.com/eventfeed/subscriptions/migrations/schema"

// parkingSQL is a ParkingLot's statements on parked_events, named in the
// lot's schema (schema.Qualified: bare, for the pool's search_path, when
// the lot has none), the statements subscriptions.GormParkingLot runs on
// the same table. They are rendered once, by newParkingSQL when the lot
// is built; a search_path lot's texts are those of a lot without
// WithSchema. Read only after construction, so safe for concurrent use.
// The placeholders are bySubscriber's ($1 subscriberKey, $2 the name) or
// byKey's ($1 entryKey, $2 the subscriber, $3 the event ID), then each
// statement's own.
type parkingSQL struct {
	// park upserts an entry, unheld ($1 entryKey, $2 subscriberKey, $3
	// subscriber, $4 event ID, $5 type, $6 position, $7 error, $8
	// attempts, $9 time, $10 aggregate; see Park).
	park string
	// count and countHeld count the subscriber's entries, all or held.
	count, countHeld string
	// purge deletes the subscriber's entries.
	purge string
	// clearRange deletes the subscriber's entries in positions ($3, $4],
	// clearKeys those of keys $3 (bytea[]), each keeping its queues headed
	// (deleteKeepingHeads).
	clearRange, clearKeys string
	// rangeEntries reads the event and aggregate IDs of the subscriber's
	// entries with an aggregate in positions ($3, $4].
	rangeEntries string
	// selectParked is the head of the listing query: parkedColumns and
	// the held_by of each of the subscriber's rows, over parked_events AS
	// p, up to its WHERE, to which selectParked appends the filter; get
	// reads one entry the same way.
	selectParked, get string
	// lockEntry locks an entry FOR NO KEY UPDATE SKIP LOCKED, reading its
	// aggregate (Replay); entryExists finds it whatever its lock;
	// deleteEntry deletes it; discard deletes it unless it is locked.
	lockEntry, entryExists, deleteEntry, discard string
	// replayFailed counts a failed replay on an entry: $4 its error, $5
	// its time.
	replayFailed string
	// heads reads the head of each of the subscriber's queues.
	heads string
	// hold parks an entry behind the head of its aggregate's queue (see
	// Hold).
	hold string
	// promote makes the first entry of the subscriber's queue of
	// aggregate $3 its head.
	promote string
}

// newParkingSQL renders a ParkingLot's statements with parked_events in
// schemaName ("" for the pool's search_path).
func newParkingSQL(schemaName string) parkingSQL {
	parked := schema.Qualified(schemaName, "parked_events")
	// heldBy is the select-list expression of ParkedEvent.HeldBy over
	// parked_events AS p: the event ID of the queue's head (its first
	// entry, never held) for a held entry, empty for others.
	heldBy := `CASE WHEN p.held_by = '' THEN '' ELSE COALESCE((SELECT h.event_id FROM ` + parked + ` h
	WHERE h.subscriber_key = p.subscriber_key AND h.subscriber = p.subscriber AND h.aggregate_id = p.aggregate_id AND h.held_by = ''
	ORDER BY h.position, h.event_id LIMIT 1), '') END`
	selectParked := `SELECT ` + parkedColumns + `, ` + heldBy + ` FROM ` + parked + ` p WHERE `
	return parkingSQL{
		park: `INSERT INTO ` + parked + `
			(key, subscriber_key, subscriber, event_id, event_type, position, error, attempts, parked_at, aggregate_id, held_by)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, '')
		ON CONFLICT (key) DO UPDATE SET event_type = excluded.event_type, position = excluded.position,
			error = excluded.error, attempts = excluded.attempts, parked_at = excluded.parked_at,
			aggregate_id = excluded.aggregate_id, held_by = excluded.held_by`,
		count:        `SELECT COUNT(*) FROM ` + parked + ` WHERE ` + bySubscriber,
		countHeld:    `SELECT COUNT(*) FROM ` + parked + ` WHERE ` + bySubscriber + ` AND held_by <> ''`,
		purge:        `DELETE FROM ` + parked + ` WHERE ` + bySubscriber,
		clearRange:   deleteKeepingHeads(parked, `position > $3 AND position <= $4`),
		clearKeys:    deleteKeepingHeads(parked, `key = ANY($3)`),
		rangeEntries: `SELECT event_id, aggregate_id FROM ` + parked + ` WHERE ` + bySubscriber + ` AND position > $3 AND position <= $4 AND aggregate_id <> ''`,
		selectParked: selectParked,
		get:          selectParked + byKey,
		lockEntry:    `SELECT aggregate_id FROM ` + parked + ` WHERE ` + byKey + ` FOR NO KEY UPDATE SKIP LOCKED`,
		entryExists:  `SELECT 1 FROM ` + parked + ` WHERE ` + byKey,
		deleteEntry:  `DELETE FROM ` + parked + ` WHERE ` + byKey,
		discard: `DELETE FROM ` + parked + `
			WHERE key IN (SELECT key FROM ` + parked + ` WHERE ` + byKey + ` FOR NO KEY UPDATE SKIP LOCKED)`,
		replayFailed: `UPDATE ` + parked + ` SET attempts = attempts + 1, error = $4, parked_at = $5 WHERE ` + byKey,
		heads: `SELECT DISTINCT ON (aggregate_id) ` + parkedColumns + `, '' FROM ` + parked + ` p
		WHERE ` + bySubscriber + ` AND held_by = '' AND aggregate_id <> '' ORDER BY aggregate_id, position, event_id`,
		hold: `WITH head AS (SELECT event_id FROM ` + parked + `
			WHERE ` + bySubscriber + ` AND aggregate_id = $3 AND held_by = '' AND position < $4
			ORDER BY position, event_id LIMIT 1 FOR KEY SHARE)
		INSERT INTO ` + parked + ` (key, subscriber_key, subscriber, event_id, event_type, position, error, attempts, parked_at, aggregate_id, held_by)
		SELECT $5, $1, $2, $6::text, $7::text, $4, $8::text, $9::integer, $10::timestamptz, $3, head.event_id FROM head
		ON CONFLICT (key) DO UPDATE SET event_type = excluded.event_type, position = excluded.position,
			error = excluded.error, attempts = excluded.attempts, parked_at = excluded.parked_at,
			aggregate_id = excluded.aggregate_id, held_by = excluded.held_by
		RETURNING held_by`,
		promote: `UPDATE ` + parked + ` SET held_by = '' WHERE key IN (SELECT key FROM ` + parked + `
		WHERE ` + bySubscriber + ` AND aggregate_id = $3 ORDER BY position, event_id LIMIT 1 FOR UPDATE) AND held_by <> ''`,
	}
}

// deleteKeepingHeads is the statement that deletes the subscriber's rows
// of parked (the qualified table) matching where ($1 and $2 are
// subscriberKey and the name, as in bySubscriber) and, of each queue it
// deletes from, makes the first entry it leaves the head, in one
// statement.
func deleteKeepingHeads(parked, where string) string {
	return `WITH d AS (DELETE FROM ` + parked + ` WHERE ` + bySubscriber + ` AND ` + where + ` RETURNING key, aggregate_id)
		UPDATE ` + parked + ` p SET held_by = '' WHERE p.subscriber_key = $1 AND p.subscriber = $2
			AND p.held_by <> '' AND p.aggregate_id IN (SELECT aggregate_id FROM d WHERE aggregate_id <> '')
			AND NOT EXISTS (SELECT 1 FROM ` + parked + ` q WHERE q.subscriber_key = p.subscriber_key AND q.subscriber = p.subscriber
				AND q.aggregate_id = p.aggregate_id AND (q.position, q.event_id) < (p.position, p.event_id)
				AND q.key NOT IN (SELECT key FROM d))`
}
