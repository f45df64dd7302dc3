package subscriptions

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/dialect"
	"github.com/eventfeed/subscriptions/internal/sqliteconf"
)

// GormParkedEventModel is the GORM model for parked events. The table is
// owned by this module and created by its migrations (package migrations),
// which NewGormParkingLot applies. On Postgres the table also has the
// digest columns key and subscriber_key, filled in by a trigger, so a row
// written through this model is one the lot reads.
type GormParkedEventModel struct {
	Subscriber string    `gorm:"primaryKey;column:subscriber"`
	EventID    string    `gorm:"primaryKey;column:event_id"`
	EventType  string    `gorm:"column:event_type"`
	Position   int64     `gorm:"column:position"`
	Error      string    `gorm:"column:error"`
	Attempts   int       `gorm:"column:attempts"`
	ParkedAt   time.Time `gorm:"column:parked_at"`
	// AggregateID is ParkedEvent.AggregateID (a column added to existing
	// tables by migration 00002).
	AggregateID string `gorm:"column:aggregate_id"`
	// HeldBy is non-empty on an entry held behind its aggregate's queue
	// (OrderedParkingLot; a column added by migration 00007): the event it
	// was held behind. Write it empty: the lot holds.
	HeldBy string `gorm:"column:held_by"`
}

// TableName returns the table name for the parked event model.
func (GormParkedEventModel) TableName() string { return "parked_events" }

// GormParkingLot is a database-backed ParkingLot. When parking happens
// inside a subscriber batch, the row is written through the batch
// transaction so the parking and the checkpoint advance commit atomically —
// a crash between the two cannot lose a poison event or park it twice.
//
// It is safe for concurrent use and does not own the *gorm.DB.
type GormParkingLot struct {
	db         *gorm.DB
	pool       *sql.DB
	dialect    *dialect.Dialect
	sqliteFile string // SQLite: the main database file, "" in memory
	// schema is WithSchema's, "" when the pool's search_path selects the
	// table; parked is the table as the lot's statements name it
	// (gormTables).
	schema string
	parked string
}

var (
	_ ParkingLot                = (*GormParkingLot)(nil)
	_ ParkingLotPurger          = (*GormParkingLot)(nil)
	_ ParkedCounter             = (*GormParkingLot)(nil)
	_ rawPurger                 = (*GormParkingLot)(nil)
	_ PartitionDeliveredClearer = (*GormParkingLot)(nil)
	_ OrderedParkingLot         = (*GormParkingLot)(nil)
)

// NewGormParkingLot creates a parking lot, applying the module's schema
// migrations if the database lacks any (see NewGormCheckpointStore,
// WithSchemaVerifyOnly and WithSchema). Construct it with the same *gorm.DB as the
// GormCheckpointStore: that is what lets Park join the batch transaction
// and commit atomically with the checkpoint advance. A lot built on a
// different handle still works, but parks non-transactionally through its
// own connection. Every call holds one connection at a time, and Park in a
// batch uses the batch's.
func NewGormParkingLot(db *gorm.DB, opts ...GormStoreOption) (*GormParkingLot, error) {
	pool, d, _, err := gormHandle("NewGormParkingLot", db)
	if err != nil {
		return nil, err
	}
	schemaName, err := ensureSchema("NewGormParkingLot", db, opts)
	if err != nil {
		return nil, err
	}
	lot := &GormParkingLot{db: db, pool: pool, dialect: d, schema: schemaName, parked: tablesIn(schemaName).parked}
	if d == dialect.SQLite {
		if lot.sqliteFile, err = sqliteconf.MainFile(db); err != nil {
			return nil, fmt.Errorf("subscriptions: NewGormParkingLot: locate the SQLite database file: %w", err)
		}
	}
	return lot, nil
}

// Park records a poison event, writing through the batch transaction when
// ctx carries one that belongs to this lot's database. A batch transaction
// from a different *gorm.DB is ignored — writing parked_events through a
// foreign connection could land the row in a different database, where
// List/Replay would never find it. Re-parking an already-parked event
// updates its error, attempt count, and timestamp (the event may be
// reprocessed after a checkpoint reset).
func (g *GormParkingLot) Park(ctx context.Context, parked ParkedEvent) error {
	if err := validateParked(parked); err != nil {
		return err
	}
	if parked.ParkedAt.IsZero() {
		parked.ParkedAt = time.Now()
	}
	db := g.batchTx(ctx)
	if db == nil {
		db = g.db
	}
	query, args := g.dialect.ParkUpsert(g.parked, dialect.ParkedRow{
		Subscriber: parked.Subscriber, EventID: parked.EventID, EventType: storableText(parked.EventType),
		Position: parked.Position, Error: storableText(parked.Error), Attempts: parked.Attempts,
		ParkedAt: parked.ParkedAt.UTC(), AggregateID: storableText(parked.AggregateID),
	})
	err := db.WithContext(ctx).Exec(query, args...).Error
	if err != nil {
		return fmt.Errorf("subscriptions: park event %q (position %d) for %q: %w", parked.EventID, parked.Position, parked.Subscriber, err)
	}
	return nil
}

var _ DeliveredClearer = (*GormParkingLot)(nil)

// ClearDelivered removes the subscriber's rows in (after, upTo] through the
// batch transaction (see deliveredClearer), by the (subscriber, position)
// index: one indexed statement per batch, which finds nothing unless the
// checkpoint was reset before a parked event (and leaves each queue it
// deletes from headed, see OrderedParkingLot).
func (g *GormParkingLot) ClearDelivered(ctx context.Context, subscriber string, after, upTo int64) error {
	where, args := g.dialect.ParkedSubscriber(subscriber)
	if err := g.deleteParked(ctx, subscriber, where+" AND position > ? AND position <= ?", append(args, after, upTo)); err != nil {
		return fmt.Errorf("subscriptions: clear the parked events of %q delivered in positions %d-%d: %w", subscriber, after+1, upTo, err)
	}
	return nil
}

// ClearsInBatch implements deliveredClearer: true when ctx carries a
// batch transaction on the lot's database.
func (g *GormParkingLot) ClearsInBatch(ctx context.Context) bool {
	return g.batchTx(ctx) != nil
}

// batchTx returns the batch transaction in ctx when it belongs to this
// lot's database: begun on the lot's own pool, or, on SQLite, on another
// handle to the same database file. Writing through any other handle
// while the batch holds SQLite's write lock would wait out the busy
// timeout and fail.
func (g *GormParkingLot) batchTx(ctx context.Context) *gorm.DB {
	if tx := txForPool(ctx, g.pool); tx != nil {
		return tx
	}
	if g.sqliteFile == "" { // Postgres, or SQLite in memory
		return nil
	}
	tx := TxFromContext(ctx)
	if tx == nil || dialect.Of(tx) != dialect.SQLite {
		return nil
	}
	if file, err := sqliteconf.MainFile(tx.WithContext(ctx)); err == nil && file == g.sqliteFile {
		return tx
	}
	return nil
}

// storableText makes free text (an error message) storable as Postgres
// text: invalid UTF-8 is replaced and NUL characters dropped.
func storableText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "")
}

// List returns the subscriber's parked events ordered by position.
func (g *GormParkingLot) List(ctx context.Context, subscriber string) ([]ParkedEvent, error) {
	out, err := g.selectParked(ctx, subscriber, ParkedFilter{})
	if err != nil {
		return nil, fmt.Errorf("subscriptions: list parked events of %q: %w", subscriber, err)
	}
	return out, nil
}

// sqliteReplays holds the SQLite entries being replayed in this process,
// keyed by database file (or, in memory, by pool): SQLite has no row lock
// to find busy, so a second replay is refused here before it would queue
// on the write lock.
var sqliteReplays = struct {
	sync.Mutex
	running map[sqliteReplayKey]bool
}{running: map[sqliteReplayKey]bool{}}

type sqliteReplayKey struct {
	database any // the file path, or the *sql.DB of an in-memory database
	entry    parkedKey
}

// claimSQLiteReplay marks the entry as being replayed and returns its
// release, or ok=false when a replay of it is already running.
func (g *GormParkingLot) claimSQLiteReplay(subscriber, eventID string) (release func(), ok bool) {
	k := sqliteReplayKey{database: g.pool, entry: parkedKey{subscriber, eventID}}
	if g.sqliteFile != "" {
		k.database = g.sqliteFile
	}
	sqliteReplays.Lock()
	defer sqliteReplays.Unlock()
	if sqliteReplays.running[k] {
		return nil, false
	}
	sqliteReplays.running[k] = true
	return func() {
		sqliteReplays.Lock()
		delete(sqliteReplays.running, k)
		sqliteReplays.Unlock()
	}, true
}

// CountParked returns how many events the subscriber has parked (see Status),
// through the index List uses.
func (g *GormParkingLot) CountParked(ctx context.Context, subscriber string) (int, error) {
	where, args := g.dialect.ParkedSubscriber(subscriber)
	var n int64
	if err := g.db.WithContext(ctx).Raw(`SELECT COUNT(*) FROM `+g.parked+` WHERE `+where, args...).Scan(&n).Error; err != nil {
		return 0, fmt.Errorf("subscriptions: count parked events of %q: %w", subscriber, err)
	}
	return int(n), nil
}

// Replay re-runs the handler and clears the parked row in one transaction.
// The handler receives the transaction via TxFromContext, so a failed
// replay rolls back both the handler's writes and the row deletion.
// Concurrent replays of the same event execute the handler at most once,
// and the one that finds the entry busy returns ErrReplayInProgress
// without running it: on Postgres the row is locked (SKIP LOCKED finds it
// taken, by another replay or by a batch re-parking it, from any process);
// on SQLite the lots of one process share a claim on the entry, and a
// replay from another process waits for SQLite's write lock and then finds
// the entry gone (ErrEventNotParked). The delete is verified, so a
// transaction whose entry vanished meanwhile rolls back its handler's
// writes instead of committing them.
func (g *GormParkingLot) Replay(ctx context.Context, subscriber, eventID string, event domain.EventEnvelope[any], handler Handler) error {
	if handler == nil {
		return fmt.Errorf("subscriptions: replay event %q for %q: nil handler", eventID, subscriber)
	}
	if !g.dialect.RowLocks {
		release, ok := g.claimSQLiteReplay(subscriber, eventID)
		if !ok {
			return fmt.Errorf("subscriptions: replay event %q for %q: %w", eventID, subscriber, ErrReplayInProgress)
		}
		defer release()
	}
	key, keyArgs := g.dialect.ParkedKey(subscriber, eventID)
	// With row locks, the lock below relies on READ COMMITTED (whatever the
	// server's default, see dialect.TxOptions): each statement sees the
	// latest commits, so a skipped row is told apart from a gone one, and a
	// Park queued behind this replay's lock updates the row it finds.
	return g.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var found []string // the entry's aggregate_id
		if g.dialect.RowLocks {
			// FOR NO KEY UPDATE, not FOR UPDATE: a batch holding an event
			// behind this entry is not kept waiting (see dialect.ParkHold).
			if err := tx.Raw("SELECT aggregate_id FROM "+g.parked+" WHERE "+key+" FOR NO KEY UPDATE SKIP LOCKED", keyArgs...).Scan(&found).Error; err != nil {
				return fmt.Errorf("subscriptions: replay event %q for %q: lock parked row: %w", eventID, subscriber, err)
			}
			if len(found) == 0 {
				// Skipped: absent, or locked by another transaction.
				if err := tx.Raw("SELECT aggregate_id FROM "+g.parked+" WHERE "+key, keyArgs...).Scan(&found).Error; err != nil {
					return fmt.Errorf("subscriptions: replay event %q for %q: read parked row: %w", eventID, subscriber, err)
				}
				if len(found) != 0 {
					return fmt.Errorf("subscriptions: replay event %q for %q: %w", eventID, subscriber, ErrReplayInProgress)
				}
			}
		} else {
			// Take SQLite's write lock first: nobody can re-park or replay the
			// event until this transaction ends.
			if err := tx.Exec("UPDATE "+g.parked+" SET attempts = attempts WHERE "+key, keyArgs...).Error; err != nil {
				return fmt.Errorf("subscriptions: replay event %q for %q: lock parked row: %w", eventID, subscriber, err)
			}
			if err := tx.Raw("SELECT aggregate_id FROM "+g.parked+" WHERE "+key, keyArgs...).Scan(&found).Error; err != nil {
				return fmt.Errorf("subscriptions: replay event %q for %q: read parked row: %w", eventID, subscriber, err)
			}
		}
		if len(found) == 0 {
			return fmt.Errorf("subscriptions: replay event %q for %q: %w", eventID, subscriber, ErrEventNotParked)
		}
		hctx, guard := handlerContext(ctx, tx, g.pool, !g.dialect.RowLocks)
		herr := handler(hctx, event)
		if ended := guard.afterHandler(ctx); ended != nil {
			herr = errors.Join(herr, ended) // the handler's failure, even if it swallowed it
		}
		if herr != nil {
			return fmt.Errorf("subscriptions: replay event %q for %q: %w", eventID, subscriber, herr)
		}
		if err := guard.misused(); err != nil {
			return fmt.Errorf("subscriptions: replay event %q for %q: %w", eventID, subscriber, err)
		}
		res := tx.Exec("DELETE FROM "+g.parked+" WHERE "+key, keyArgs...)
		if res.Error != nil {
			return fmt.Errorf("subscriptions: replay event %q for %q: clear parked row: %w", eventID, subscriber, res.Error)
		}
		if res.RowsAffected != 1 {
			return fmt.Errorf("subscriptions: replay event %q for %q: the entry was cleared meanwhile: %w", eventID, subscriber, ErrReplayInProgress)
		}
		if err := g.promote(tx, subscriber, found[0]); err != nil {
			return fmt.Errorf("subscriptions: replay event %q for %q: %w", eventID, subscriber, err)
		}
		return nil
	}, g.dialect.TxOptionsList()...)
}

// Purge deletes every event parked for subscriber, through the batch
// transaction in ctx when it belongs to this lot's database (as Park does).
func (g *GormParkingLot) Purge(ctx context.Context, subscriber string) error {
	if err := g.purge(ctx, subscriber); err != nil {
		return fmt.Errorf("subscriptions: purge parked events of %q: %w", subscriber, err)
	}
	return nil
}

// purge is Purge without context in its errors (see rawPurger).
func (g *GormParkingLot) purge(ctx context.Context, subscriber string) error {
	db := g.batchTx(ctx)
	if db == nil {
		db = g.db
	}
	where, args := g.dialect.ParkedSubscriber(subscriber)
	return db.WithContext(ctx).Exec("DELETE FROM "+g.parked+" WHERE "+where, args...).Error
}

var _ ManagedParkingLot = (*GormParkingLot)(nil)

// parkedColumns are the columns read into GormParkedEventModel, but for
// held_by (dialect.HeldByColumn, or the column itself).
const parkedColumns = "subscriber, event_id, event_type, position, error, attempts, parked_at, aggregate_id"

// selectParked is the one query behind List and ListFiltered: the
// subscriber's rows through its index, filtered, in position order.
func (g *GormParkingLot) selectParked(ctx context.Context, subscriber string, filter ParkedFilter) ([]ParkedEvent, error) {
	where, args := g.dialect.ParkedSubscriber(subscriber)
	if filter.EventType != "" {
		where, args = where+" AND event_type = ?", append(args, filter.EventType)
	}
	if filter.AggregateID != "" {
		where, args = where+" AND aggregate_id = ?", append(args, filter.AggregateID)
	}
	where, args = where+" AND position > ?", append(args, filter.AfterPosition)
	limit := ""
	if filter.Limit > 0 {
		limit, args = " LIMIT ?", append(args, filter.Limit)
	}
	var rows []GormParkedEventModel
	err := g.db.WithContext(ctx).Raw(`SELECT `+parkedColumns+`, `+g.dialect.HeldByColumn(g.parked)+` FROM `+g.parked+` p WHERE `+where+` ORDER BY position, event_id`+limit, args...).Scan(&rows).Error
	if err != nil {
		return nil, err
	}
	out := make([]ParkedEvent, len(rows))
	for i, r := range rows {
		out[i] = r.parkedEvent()
	}
	return out, nil
}

func (r GormParkedEventModel) parkedEvent() ParkedEvent {
	return ParkedEvent{
		Subscriber:  r.Subscriber,
		EventID:     r.EventID,
		EventType:   r.EventType,
		Position:    r.Position,
		Error:       r.Error,
		Attempts:    r.Attempts,
		ParkedAt:    r.ParkedAt.UTC(),
		AggregateID: r.AggregateID,
		HeldBy:      r.HeldBy,
	}
}

// ListFiltered returns the subscriber's parked events matching filter in
// position order.
func (g *GormParkingLot) ListFiltered(ctx context.Context, subscriber string, filter ParkedFilter) ([]ParkedEvent, error) {
	out, err := g.selectParked(ctx, subscriber, filter)
	if err != nil {
		return nil, fmt.Errorf("subscriptions: list parked events of %q (filter %+v): %w", subscriber, filter, err)
	}
	return out, nil
}

// Get returns one parked entry.
func (g *GormParkingLot) Get(ctx context.Context, subscriber, eventID string) (ParkedEvent, error) {
	var rows []GormParkedEventModel
	where, args := g.dialect.ParkedKey(subscriber, eventID)
	err := g.db.WithContext(ctx).Raw(`SELECT `+parkedColumns+`, `+g.dialect.HeldByColumn(g.parked)+` FROM `+g.parked+` p WHERE `+where, args...).Scan(&rows).Error
	if err != nil {
		return ParkedEvent{}, fmt.Errorf("subscriptions: parked event %q of %q: %w", eventID, subscriber, err)
	}
	if len(rows) == 0 {
		return ParkedEvent{}, fmt.Errorf("subscriptions: parked event %q of %q: %w", eventID, subscriber, ErrEventNotParked)
	}
	return rows[0].parkedEvent(), nil
}

// Discard deletes a parked row and returns it, and makes the next entry
// of its queue the head when it was the head (see OrderedParkingLot), in
// one transaction. A row being replayed is
// refused with ErrReplayInProgress, as a second replay is (see Replay):
// on Postgres the row lock is skipped, not waited for, and a skipped row
// that still exists is busy; on SQLite the discard takes the same
// in-process claim as a replay.
func (g *GormParkingLot) Discard(ctx context.Context, subscriber, eventID string) (ParkedEvent, error) {
	where, args := g.dialect.ParkedKey(subscriber, eventID)
	if g.dialect.RowLocks {
		where = "key IN (SELECT key FROM " + g.parked + " WHERE " + where + " FOR NO KEY UPDATE SKIP LOCKED)"
	} else {
		release, ok := g.claimSQLiteReplay(subscriber, eventID)
		if !ok {
			return ParkedEvent{}, fmt.Errorf("subscriptions: discard event %q of %q: %w", eventID, subscriber, ErrReplayInProgress)
		}
		defer release()
	}
	var rows []GormParkedEventModel
	err := g.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Raw(`DELETE FROM `+g.parked+` WHERE `+where+` RETURNING `+parkedColumns+`, held_by`, args...).Scan(&rows).Error; err != nil {
			return err
		}
		if len(rows) != 1 {
			return nil
		}
		if err := g.promote(tx, subscriber, rows[0].AggregateID); err != nil {
			return err
		}
		if rows[0].HeldBy != "" { // held: it names its queue's head, as reads do
			head, err := g.head(tx, subscriber, rows[0].AggregateID)
			rows[0].HeldBy = head
			return err
		}
		return nil
	}, g.dialect.TxOptionsList()...)
	if err != nil {
		return ParkedEvent{}, fmt.Errorf("subscriptions: discard event %q of %q: %w", eventID, subscriber, err)
	}
	if len(rows) == 1 {
		return rows[0].parkedEvent(), nil
	}
	if g.dialect.RowLocks { // skipped: absent, or locked by a replay
		if _, err := g.Get(ctx, subscriber, eventID); err == nil {
			return ParkedEvent{}, fmt.Errorf("subscriptions: discard event %q of %q: %w", eventID, subscriber, ErrReplayInProgress)
		}
	}
	return ParkedEvent{}, fmt.Errorf("subscriptions: discard event %q of %q: %w", eventID, subscriber, ErrEventNotParked)
}

// RecordReplayFailure counts a failed replay on the row, if it is still
// parked.
func (g *GormParkingLot) RecordReplayFailure(ctx context.Context, subscriber, eventID, errText string, at time.Time) error {
	where, keyArgs := g.dialect.ParkedKey(subscriber, eventID)
	args := append([]any{storableText(errText), at.UTC()}, keyArgs...)
	if err := g.db.WithContext(ctx).Exec(`UPDATE `+g.parked+` SET attempts = attempts + 1, error = ?, parked_at = ? WHERE `+where, args...).Error; err != nil {
		return fmt.Errorf("subscriptions: record the failed replay of event %q for %q: %w", eventID, subscriber, err)
	}
	return nil
}

// ClearPartitionDelivered on Postgres is one indexed DELETE, as
// clearDelivered is, with the partition's hash filter (dialect.PartitionHash
// on the entry's aggregate_id). SQLite has no MD5: the range's entries (in the
// usual case none: only a reset makes a live batch cover a parked event)
// are read through the batch transaction, filtered with PartitionOf, and
// the partition's deleted by key.
func (g *GormParkingLot) ClearPartitionDelivered(ctx context.Context, subscriber string, partition, partitions int, after, upTo int64) error {
	db := g.batchTx(ctx)
	if db == nil {
		db = g.db
	}
	db = db.WithContext(ctx)
	what := func(err error) error {
		return fmt.Errorf("subscriptions: clear the parked events of %q (partition %d of %d) delivered in positions %d-%d: %w",
			subscriber, partition, partitions, after+1, upTo, err)
	}
	if hash := g.dialect.PartitionHash(); hash != "" { // the partition hash in SQL
		where, args := g.dialect.ParkedSubscriber(subscriber)
		if err := g.deleteParked(ctx, subscriber, where+" AND position > ? AND position <= ? AND aggregate_id <> '' AND mod("+hash+", ?) = ?",
			append(args, after, upTo, partitions, partition)); err != nil {
			return what(err)
		}
		return nil
	}
	var rows []struct {
		EventID     string
		AggregateID string
	}
	if err := db.Raw("SELECT event_id, aggregate_id FROM "+g.parked+" WHERE subscriber = ? AND position > ? AND position <= ?",
		subscriber, after, upTo).Scan(&rows).Error; err != nil {
		return what(err)
	}
	for _, row := range rows {
		if row.AggregateID == "" || PartitionOf(row.AggregateID, partitions) != partition {
			continue
		}
		if err := g.deleteParked(ctx, subscriber, "subscriber = ? AND event_id = ?", []any{subscriber, row.EventID}); err != nil {
			return what(fmt.Errorf("event %q: %w", row.EventID, err))
		}
	}
	return nil
}
