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

// ParkUpsert is the statement that parks row, or updates the row already
// parked for the same event.
func (d *Dialect) ParkUpsert(row ParkedRow) (string, []any) {
	const update = ` DO UPDATE SET event_type = excluded.event_type, position = excluded.position,
				error = excluded.error, attempts = excluded.attempts, parked_at = excluded.parked_at, aggregate_id = excluded.aggregate_id`
	if d.HashedParkedKeys {
		return `INSERT INTO parked_events (key, subscriber_key, subscriber, event_id, event_type, position, error, attempts, parked_at, aggregate_id)
			VALUES (decode(?, 'hex'), decode(?, 'hex'), ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (key)` + update,
			[]any{digest(row.Subscriber + "\x00" + row.EventID), digest(row.Subscriber), row.Subscriber, row.EventID,
				row.EventType, row.Position, row.Error, row.Attempts, row.ParkedAt, row.AggregateID}
	}
	return `INSERT INTO parked_events (subscriber, event_id, event_type, position, error, attempts, parked_at, aggregate_id)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (subscriber, event_id)` + update,
		[]any{row.Subscriber, row.EventID, row.EventType, row.Position, row.Error, row.Attempts, row.ParkedAt, row.AggregateID}
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
