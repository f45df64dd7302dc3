// Package dialect is the module's one seam between its database code and
// the engines it supports, Postgres and SQLite: the SQL text that differs
// between them and what each can do. The root package and package
// infrastructure ask a *Dialect instead of testing the engine's name, the
// way river's driver interface keeps SQL out of its core; where the two
// engines need different algorithms (row locks across processes against
// serialized writers in one process), the callers branch on a capability,
// never on a name. Errors are classified in package sqlerr.
//
// A *Dialect is immutable and safe for concurrent use.
package dialect

import (
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/infrastructure/pgevents"
	"github.com/eventfeed/subscriptions/migrations/schema"
)

// Dialect is one engine's SQL and capabilities. Postgres and SQLite are
// the only values.
type Dialect struct {
	// Name is gorm.DB.Name() for the engine.
	Name string
	// RowLocks: rows can be locked with SELECT ... FOR UPDATE [SKIP
	// LOCKED], so processes sharing the database coordinate through them
	// (replicas, replays), and a statement can be cancelled on the server.
	// Without them (SQLite) writers are serialized by the database's write
	// lock and coordination is in process.
	RowLocks bool
	// Notify: LISTEN/NOTIFY wake-ups exist (pg_notify in the append's
	// transaction).
	Notify bool
	// AdvisoryLocks: transaction-scoped advisory locks exist; appends
	// serialize through one keyed by the events table (see WriteLock).
	AdvisoryLocks bool
	// Pipelines: the driver (pgx) can send several statements in one round
	// trip, which the acquire and append pipelines use when the pool is
	// pgx's.
	Pipelines bool
	// JSONB: the JSON columns are jsonb, and a text parameter bound to one
	// needs a cast.
	JSONB bool
	// Claims: subscriber_attempts rows carry an attempt claim (holder,
	// holder_pid, claimed_at; Postgres' migration 00004), which keeps other
	// processes' replicas out in the moment a batch takes its checkpoint
	// again (see LiveClaim). One process serves a SQLite database, whose
	// batches of a subscriber are serialized in process: no claim.
	Claims bool
	// HashedParkedKeys: parked_events is reached through digest columns
	// (key, subscriber_key; Postgres' index entries are size-limited),
	// filled in by a trigger; see ParkedKey and ParkedSubscriber.
	HashedParkedKeys bool

	txOptions     *sql.TxOptions
	forUpdate     string
	bytewise      string
	backendPID    string
	cancelBackend string
	showIsolation string
	partitionHash string
	claimPID      string
	claimNow      string
}

// MD5PartitionHash is subscriptions.PartitionOf's hash as an SQL
// expression on aggregate_id, for engines with md5() (Postgres):
// pgevents.PartitionHash, the one every Postgres store reads with. It is
// a constant for queries built at compile time; elsewhere ask
// PartitionHash.
const MD5PartitionHash = pgevents.PartitionHash

var (
	// Postgres is the Postgres dialect.
	Postgres = &Dialect{
		Name:             schema.Postgres,
		RowLocks:         true,
		Notify:           true,
		AdvisoryLocks:    true,
		Pipelines:        true,
		JSONB:            true,
		Claims:           true,
		HashedParkedKeys: true,
		// Row locking with SKIP LOCKED, the compare-and-set commit, and
		// the append's read after its lock are designed for READ
		// COMMITTED: set whatever the server's default_transaction_isolation.
		txOptions:     &sql.TxOptions{Isolation: sql.LevelReadCommitted},
		forUpdate:     " FOR UPDATE",
		bytewise:      ` COLLATE "C"`,
		backendPID:    "SELECT pg_backend_pid()",
		cancelBackend: "SELECT pg_cancel_backend(?)",
		showIsolation: "SHOW transaction_isolation",
		partitionHash: MD5PartitionHash,
		claimPID:      "pg_backend_pid()",
		claimNow:      "statement_timestamp()",
	}
	// SQLite is the SQLite dialect.
	SQLite = &Dialect{Name: schema.SQLite}
)

// Of returns the dialect of db (by gorm.DB.Name()), nil for an engine the
// module does not support.
func Of(db *gorm.DB) *Dialect {
	switch db.Name() {
	case schema.Postgres:
		return Postgres
	case schema.SQLite:
		return SQLite
	}
	return nil
}

// TxOptions are the options the module's own transactions begin with (nil:
// the driver's defaults).
func (d *Dialect) TxOptions() *sql.TxOptions { return d.txOptions }

// TxOptionsList is TxOptions as gorm.DB.Transaction's variadic argument.
func (d *Dialect) TxOptionsList() []*sql.TxOptions {
	if d.txOptions == nil {
		return nil
	}
	return []*sql.TxOptions{d.txOptions}
}

// ForUpdate is the clause that locks the rows a SELECT reads until the
// transaction ends, "" where writers are serialized anyway (SQLite).
func (d *Dialect) ForUpdate() string { return d.forUpdate }

// Bytewise is the collation clause that orders a text column by its bytes
// (appended to the column in ORDER BY); "" where that is the default.
func (d *Dialect) Bytewise() string { return d.bytewise }

// BackendPID is the query that returns the ID of the server process
// serving the connection it runs on, for CancelBackend; "" without
// RowLocks (an in-process engine's statements end with the driver's
// cancellation).
func (d *Dialect) BackendPID() string { return d.backendPID }

// CancelBackend is the statement that cancels, from another connection,
// the statement that the server process BackendPID returned (its one
// argument) is running; "" without RowLocks.
func (d *Dialect) CancelBackend() string { return d.cancelBackend }

// ShowIsolation is the query that reads the current transaction's
// isolation level, and the level it reads under READ COMMITTED, the level
// TxOptions chooses; both "" where the module chooses none (TxOptions is
// nil: SQLite's transactions are serializable).
func (d *Dialect) ShowIsolation() (query, readCommitted string) {
	if d.showIsolation == "" {
		return "", ""
	}
	return d.showIsolation, "read committed"
}

// PartitionHash is subscriptions.PartitionOf's hash of aggregate_id as an
// SQL expression (MD5PartitionHash), "" where the engine has no MD5
// (SQLite): there the caller filters in Go with PartitionOf.
func (d *Dialect) PartitionHash() string { return d.partitionHash }

// WriteLock is the statement an append takes its lock with, before it
// reads the feed head, its arguments, and what it takes (for errors): a
// transaction-scoped advisory lock on key (AdvisoryLocks), or else the
// database's write lock, taken at once whatever the DSN's transaction mode
// (on SQLite a read transaction that later writes could be refused with
// "database is locked" instead of waiting).
func (d *Dialect) WriteLock(key int64) (query string, args []any, what string) {
	if d.AdvisoryLocks {
		return "SELECT pg_advisory_xact_lock(?)", []any{key}, "append lock"
	}
	return "UPDATE events SET position = position WHERE 0", nil, "write lock"
}

// ParkedKey selects one parked_events row through the table's key index.
func (d *Dialect) ParkedKey(subscriber, eventID string) (where string, args []any) {
	if d.HashedParkedKeys {
		return "key = decode(?, 'hex') AND subscriber = ? AND event_id = ?", []any{digest(subscriber + "\x00" + eventID), subscriber, eventID}
	}
	return "subscriber = ? AND event_id = ?", []any{subscriber, eventID}
}

// ParkedSubscriber selects one subscriber's parked_events rows through the
// table's subscriber index.
func (d *Dialect) ParkedSubscriber(subscriber string) (where string, args []any) {
	if d.HashedParkedKeys {
		return "subscriber_key = decode(?, 'hex') AND subscriber = ?", []any{digest(subscriber), subscriber}
	}
	return "subscriber = ?", []any{subscriber}
}

// ParkedRow is one parked_events row to write.
type ParkedRow struct {
	Subscriber, EventID, EventType string
	Position                       int64
	Error                          string
	Attempts                       int
	ParkedAt                       time.Time // UTC
	AggregateID                    string
}

// parkUpdate is what parking an event already parked changes.
const parkUpdate = ` DO UPDATE SET event_type = excluded.event_type, position = excluded.position,
				error = excluded.error, attempts = excluded.attempts, parked_at = excluded.parked_at,
				aggregate_id = excluded.aggregate_id, held_by = excluded.held_by`

// ParkUpsert is the statement that parks row for its own failure, or
// updates the row already parked for the same event, in the parked_events
// table named table (bare, or schema-qualified as schema.Qualified spells
// it; so for every statement here that takes one).
func (d *Dialect) ParkUpsert(table string, row ParkedRow) (string, []any) {
	if d.HashedParkedKeys {
		return `INSERT INTO ` + table + ` (key, subscriber_key, subscriber, event_id, event_type, position, error, attempts, parked_at, aggregate_id, held_by)
			VALUES (decode(?, 'hex'), decode(?, 'hex'), ?, ?, ?, ?, ?, ?, ?, ?, '')
			ON CONFLICT (key)` + parkUpdate,
			[]any{digest(row.Subscriber + "\x00" + row.EventID), digest(row.Subscriber), row.Subscriber, row.EventID,
				row.EventType, row.Position, row.Error, row.Attempts, row.ParkedAt, row.AggregateID}
	}
	return `INSERT INTO ` + table + ` (subscriber, event_id, event_type, position, error, attempts, parked_at, aggregate_id, held_by)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, '')
			ON CONFLICT (subscriber, event_id)` + parkUpdate,
		[]any{row.Subscriber, row.EventID, row.EventType, row.Position, row.Error, row.Attempts, row.ParkedAt, row.AggregateID}
}

// ParkHold is the statement that parks row held behind the head of its
// aggregate's queue, the first entry of the aggregate (never held), when
// that lies before row.Position, and returns the head's event ID
// (RETURNING held_by); it writes nothing, and returns no row, when none
// does. On Postgres it takes a FOR KEY SHARE lock on the head, which a
// replay's or discard's FOR NO KEY UPDATE does not conflict with: a head
// being replayed is still found, and its DELETE then waits for this
// transaction, after which the removal's promotion (PromoteHead) sees the
// held row. With FOR UPDATE the hold would wait for the replay and then
// miss the entry the replay promoted.
func (d *Dialect) ParkHold(table string, row ParkedRow) (string, []any) {
	sub, subArgs := d.ParkedSubscriber(row.Subscriber)
	head := `SELECT event_id FROM ` + table + ` WHERE ` + sub + ` AND aggregate_id = ? AND held_by = '' AND position < ?
			ORDER BY position, event_id LIMIT 1`
	headArgs := append(subArgs, row.AggregateID, row.Position)
	if d.HashedParkedKeys {
		return `WITH head AS (` + head + ` FOR KEY SHARE)
			INSERT INTO ` + table + ` (key, subscriber_key, subscriber, event_id, event_type, position, error, attempts, parked_at, aggregate_id, held_by)
			SELECT decode(?, 'hex'), decode(?, 'hex'), CAST(? AS text), CAST(? AS text), CAST(? AS text), CAST(? AS bigint),
				CAST(? AS text), CAST(? AS integer), CAST(? AS timestamptz), CAST(? AS text), head.event_id FROM head
			ON CONFLICT (key)` + parkUpdate + ` RETURNING held_by`,
			append(headArgs, digest(row.Subscriber+"\x00"+row.EventID), digest(row.Subscriber), row.Subscriber, row.EventID,
				row.EventType, row.Position, row.Error, row.Attempts, row.ParkedAt, row.AggregateID)
	}
	// SQLite: the SELECT of an upsert needs a WHERE (a parsing ambiguity).
	return `INSERT INTO ` + table + ` (subscriber, event_id, event_type, position, error, attempts, parked_at, aggregate_id, held_by)
			SELECT ?, ?, ?, ?, ?, ?, ?, ?, head.event_id FROM (` + head + `) AS head WHERE true
			ON CONFLICT (subscriber, event_id)` + parkUpdate + ` RETURNING held_by`,
		append([]any{row.Subscriber, row.EventID, row.EventType, row.Position, row.Error, row.Attempts, row.ParkedAt, row.AggregateID}, headArgs...)
}

// PromoteHead is the statement that makes the first entry of subscriber's
// queue of aggregate its head (not held), after an entry of it was
// removed in the same transaction. On Postgres the first entry is locked
// FOR UPDATE: one that a concurrent removal deletes is skipped, after
// waiting, for the next (two removals of one queue at once may deadlock,
// and the server then aborts one, rather than leave the queue headless).
func (d *Dialect) PromoteHead(table, subscriber, aggregate string) (string, []any) {
	sub, subArgs := d.ParkedSubscriber(subscriber)
	first := ` FROM ` + table + ` WHERE ` + sub + ` AND aggregate_id = ? ORDER BY position, event_id LIMIT 1`
	if d.HashedParkedKeys {
		return `UPDATE ` + table + ` SET held_by = '' WHERE key IN (SELECT key` + first + ` FOR UPDATE) AND held_by <> ''`,
			append(subArgs, aggregate)
	}
	return `UPDATE ` + table + ` SET held_by = '' WHERE ` + sub + ` AND event_id IN (SELECT event_id` + first + `) AND held_by <> ''`,
		append(append(subArgs, subArgs...), aggregate)
}

// DeleteParked is the statement that deletes the parked_events rows of
// where (over the table's own columns) and keeps every queue headed (see
// PromoteHead). On Postgres it is one statement, which promotes, of each
// queue it deleted from, the first entry it leaves, when held
// (promotes is false). On SQLite it returns the deleted rows'
// aggregate_id, for the caller to run PromoteHead for each, in the same
// transaction (promotes is true).
func (d *Dialect) DeleteParked(table, subscriber, where string, args []any) (query string, allArgs []any, promote bool) {
	if !d.HashedParkedKeys {
		return `DELETE FROM ` + table + ` WHERE ` + where + ` RETURNING aggregate_id`, args, true
	}
	return `WITH d AS (DELETE FROM ` + table + ` WHERE ` + where + ` RETURNING key, aggregate_id)
		UPDATE ` + table + ` p SET held_by = '' WHERE p.subscriber_key = decode(?, 'hex') AND p.subscriber = ?
			AND p.held_by <> '' AND p.aggregate_id IN (SELECT aggregate_id FROM d WHERE aggregate_id <> '')
			AND NOT EXISTS (SELECT 1 FROM ` + table + ` q WHERE q.subscriber_key = p.subscriber_key AND q.subscriber = p.subscriber
				AND q.aggregate_id = p.aggregate_id AND (q.position, q.event_id) < (p.position, p.event_id)
				AND q.key NOT IN (SELECT key FROM d))`, append(args, digest(subscriber), subscriber), false
}

// HeldByColumn is the select-list expression of ParkedEvent.HeldBy over
// table AS p: the event ID of the queue's head for a held entry, empty
// for others.
func (d *Dialect) HeldByColumn(table string) string {
	match := `h.subscriber = p.subscriber`
	if d.HashedParkedKeys {
		match = `h.subscriber_key = p.subscriber_key AND ` + match
	}
	return `CASE WHEN p.held_by = '' THEN '' ELSE COALESCE((SELECT h.event_id FROM ` + table + ` h WHERE ` + match + `
		AND h.aggregate_id = p.aggregate_id AND h.held_by = '' ORDER BY h.position, h.event_id LIMIT 1), '') END AS held_by`
}

// digest is a parked_events digest column's value, hex-encoded (GORM would
// expand a []byte argument into a list): SHA-256 of the subscriber name,
// or of the subscriber name and the event ID separated by a NUL (which
// neither may contain).
func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// ClaimValues are the SQL expressions an attempt claim records (Claims),
// in a subscriber_attempts row's holder_pid and claimed_at: the server
// process of the connection writing it and the server's clock.
func (d *Dialect) ClaimValues() (pid, now string) { return d.claimPID, d.claimNow }

// LiveClaim is a condition on the subscriber_attempts row row (a table
// name or alias) that is true while another runner than holder claims
// it, for an attempt from checkpoint or for a commit past it (a record
// ahead of the checkpoint, written for the commit its batch is about to
// make): the claim is younger than lease and the server process that
// wrote it is still there. Without Claims it is false
// (with the same arguments).
func (d *Dialect) LiveClaim(row, holder string, checkpoint int64, lease time.Duration) (string, []any) {
	if !d.Claims {
		return "(? IS NULL AND ? IS NULL)", []any{holder, checkpoint} // false, with the same arguments
	}
	return fmt.Sprintf(`(%[1]s.holder <> '' AND %[1]s.holder <> ? AND %[1]s.position >= ?
		AND %[1]s.claimed_at > statement_timestamp() - interval '%[2]d milliseconds'
		AND EXISTS (SELECT 1 FROM pg_stat_get_activity(%[1]s.holder_pid)))`, row, lease.Milliseconds()), []any{holder, checkpoint}
}

// PositionIn selects the rows of the events table at positions, in one
// parameter whatever their number on Postgres (a bigint[] literal: one
// statement text for the driver's statement cache), as a list elsewhere.
func (d *Dialect) PositionIn(positions []int64) (string, []any) {
	if !d.JSONB { // SQLite: GORM expands the slice
		return "position IN ?", []any{positions}
	}
	return "position = ANY(?::bigint[])", []any{pgevents.PositionsArray(positions)}
}
