package subscriptions

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"
)

// This file holds the durable attempt count behind "WithMaxRetries
// retries, then parked" (docs/design.md, "Attempt counts"): every
// attempt is counted before it runs, in a write committed on its own, so
// that replicas sharing a checkpoint and restarts of a crashed process
// continue one count instead of each starting at zero.

// attemptRecord is the attempt in progress at one checkpoint row (a
// subscriber, or a partition of one): the checkpoint it started from, the
// first and last events it covers, how many times an attempt at them has
// started, and the last failure recorded. A record whose position is no
// longer the checkpoint's is void: the commit that moves the checkpoint
// clears it.
type attemptRecord struct {
	position  int64  // the checkpoint the attempt started from
	eventID   string // the first event attempted
	through   int64  // the position of the last event attempted
	attempts  int
	lastError string
}

// sameAttempt reports whether a, a stored record, is of an earlier
// attempt at rec: the same position and first event, or a failure marker
// at the same position (attempts 0: the event a.eventID at a.through
// failed after the events before it had been handled, see countAttempt).
func (a attemptRecord) sameAttempt(rec attemptRecord) bool {
	return a.position == rec.position && (a.eventID == rec.eventID || a.attempts == 0)
}

// single reports whether the record is for one event at position at: a
// retry, or an attempt narrowed to the event after a failure.
func (a attemptRecord) single(at int64) bool { return a.through == at }

// attemptCounter is the optional capability of a CheckpointStore that
// keeps attempt counts where every replica of the subscriber sees them.
// GormCheckpointStore and MemoryCheckpointStore implement it; for any
// other store each Subscriber counts in its own memory (localAttempts),
// as before: then replicas and restarts each count from zero.
//
// Every method is called by the holder of the subscriber's batch (or, for
// failAttempt, by the runner that just ended one), so that no two callers
// race on one record.
type attemptCounter interface {
	// beginAttempt records, committed before it returns, that batch is
	// about to run the events rec.eventID (after rec.position) through
	// rec.through, as attempt 1. If a record of an earlier attempt at it
	// exists (sameAttempt: one that did not complete), it writes nothing
	// and returns that record with found true.
	beginAttempt(ctx context.Context, batch Batch, subscriber string, rec attemptRecord) (prev attemptRecord, found bool, err error)
	// putAttempt writes rec, committed before it returns.
	putAttempt(ctx context.Context, batch Batch, subscriber string, rec attemptRecord) error
	// failAttempt records rec.lastError for the single event rec
	// describes: on the record of the same event, keeping its count, or as
	// a new record of rec.attempts. A non-nil batch is the failed
	// attempt's: failAttempt rolls it back, and no batch of the subscriber
	// starts before the failure is recorded (so the next attempt, by any
	// replica, sees it). batch is ended even when the error is not nil.
	failAttempt(ctx context.Context, batch Batch, subscriber string, rec attemptRecord) error
	// hasAttempt reports whether a record of an attempt from position is
	// there, read in batch's transaction (nothing committed).
	hasAttempt(ctx context.Context, batch Batch, subscriber string, position int64) (bool, error)
	// clearAttempt removes the subscriber's record as part of batch: it is
	// gone once the batch commits, and kept if it rolls back.
	clearAttempt(ctx context.Context, batch Batch, subscriber string) error
}

var (
	_ attemptCounter = (*GormCheckpointStore)(nil)
	_ attemptCounter = (*MemoryCheckpointStore)(nil)
	_ attemptCounter = (*localAttempts)(nil)
	_ attemptCounter = (*fallbackAttempts)(nil)
)

// errAttemptMoved is beginAttempt's or putAttempt's error when the
// checkpoint moved (a Reset) while the record was written: the batch is
// to be given up as on ErrCheckpointMoved.
var errAttemptMoved = fmt.Errorf("recording the attempt: %w", ErrCheckpointMoved)

// attemptTable keeps records in memory: the memory checkpoint store's
// (shared by the subscribers that share the store) and the in-process
// fallback for other stores.
type attemptTable struct {
	mu      sync.Mutex
	records map[string]attemptRecord
}

func (t *attemptTable) begin(subscriber string, rec attemptRecord) (attemptRecord, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if prev, ok := t.records[subscriber]; ok && prev.sameAttempt(rec) {
		return prev, true
	}
	t.put(subscriber, rec)
	return attemptRecord{}, false
}

// put stores rec; t.mu is held.
func (t *attemptTable) put(subscriber string, rec attemptRecord) {
	if t.records == nil {
		t.records = make(map[string]attemptRecord)
	}
	t.records[subscriber] = rec
}

func (t *attemptTable) set(subscriber string, rec attemptRecord) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.put(subscriber, rec)
}

func (t *attemptTable) fail(subscriber string, rec attemptRecord) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if prev, ok := t.records[subscriber]; ok && prev.position == rec.position && prev.eventID == rec.eventID && prev.through == rec.through {
		prev.lastError = rec.lastError
		t.records[subscriber] = prev
		return
	}
	t.put(subscriber, rec)
}

func (t *attemptTable) has(subscriber string, position int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	rec, ok := t.records[subscriber]
	return ok && rec.position == position
}

func (t *attemptTable) clear(subscriber string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.records, subscriber)
}

// localAttempts is the in-process count for a CheckpointStore without
// attemptCounter: one per Subscriber (and shared by its partitions), lost
// with the process. clearAttempt clears at once; the records are voided
// by position anyway when the batch commits.
type localAttempts struct{ t attemptTable }

func (l *localAttempts) beginAttempt(_ context.Context, _ Batch, subscriber string, rec attemptRecord) (attemptRecord, bool, error) {
	prev, found := l.t.begin(subscriber, rec)
	return prev, found, nil
}

func (l *localAttempts) putAttempt(_ context.Context, _ Batch, subscriber string, rec attemptRecord) error {
	l.t.set(subscriber, rec)
	return nil
}

func (l *localAttempts) failAttempt(_ context.Context, batch Batch, subscriber string, rec attemptRecord) error {
	l.t.fail(subscriber, rec)
	return rollbackIf(batch)
}

// rollbackIf rolls batch back unless it is nil.
func rollbackIf(batch Batch) error {
	if batch == nil {
		return nil
	}
	return batch.Rollback()
}

func (l *localAttempts) hasAttempt(_ context.Context, _ Batch, subscriber string, position int64) (bool, error) {
	return l.t.has(subscriber, position), nil
}

func (l *localAttempts) clearAttempt(_ context.Context, _ Batch, subscriber string) error {
	l.t.clear(subscriber)
	return nil
}

// fallbackAttempts is the store's attemptCounter with an in-process
// fallback: when the store cannot write a record for want of a second
// connection (errNoSecondConn: a Postgres pool of one connection, or one
// whose connections all hold batches), the attempt is counted in this
// process instead (localAttempts), with a warning the first time, so that
// the subscriber goes on with the count it had before counts were shared
// rather than failing every batch. Used by one Subscriber's runners.
type fallbackAttempts struct {
	store  attemptCounter
	local  localAttempts
	warned atomic.Bool
	logger *slog.Logger
}

// fellBack reports whether err is errNoSecondConn, warning once.
func (f *fallbackAttempts) fellBack(subscriber string, err error) bool {
	if !errors.Is(err, errNoSecondConn) {
		return false
	}
	if !f.warned.Swap(true) {
		f.logger.Warn("subscriber: attempts are counted in this process only while the pool has no connection to spare for the shared count (give the pool one connection more than the batches it runs at once)",
			"subscriber", subscriber, "error", err)
	}
	return true
}

func (f *fallbackAttempts) beginAttempt(ctx context.Context, batch Batch, subscriber string, rec attemptRecord) (attemptRecord, bool, error) {
	prev, found, err := f.store.beginAttempt(ctx, batch, subscriber, rec)
	if f.fellBack(subscriber, err) {
		return f.local.beginAttempt(ctx, batch, subscriber, rec)
	}
	return prev, found, err
}

func (f *fallbackAttempts) putAttempt(ctx context.Context, batch Batch, subscriber string, rec attemptRecord) error {
	err := f.store.putAttempt(ctx, batch, subscriber, rec)
	if f.fellBack(subscriber, err) {
		return f.local.putAttempt(ctx, batch, subscriber, rec)
	}
	return err
}

func (f *fallbackAttempts) failAttempt(ctx context.Context, batch Batch, subscriber string, rec attemptRecord) error {
	err := f.store.failAttempt(ctx, batch, subscriber, rec) // ends batch either way
	if f.fellBack(subscriber, err) {
		return f.local.failAttempt(ctx, nil, subscriber, rec)
	}
	return err
}

func (f *fallbackAttempts) hasAttempt(ctx context.Context, batch Batch, subscriber string, position int64) (bool, error) {
	if f.local.t.has(subscriber, position) {
		return true, nil
	}
	return f.store.hasAttempt(ctx, batch, subscriber, position)
}

func (f *fallbackAttempts) clearAttempt(ctx context.Context, batch Batch, subscriber string) error {
	_ = f.local.clearAttempt(ctx, batch, subscriber) // never fails
	return f.store.clearAttempt(ctx, batch, subscriber)
}

// MemoryCheckpointStore: the records live in the store, so replicas that
// share it share the count. clearAttempt takes effect when the batch
// commits.

func (m *MemoryCheckpointStore) beginAttempt(_ context.Context, _ Batch, subscriber string, rec attemptRecord) (attemptRecord, bool, error) {
	prev, found := m.attempts.begin(subscriber, rec)
	return prev, found, nil
}

func (m *MemoryCheckpointStore) putAttempt(_ context.Context, _ Batch, subscriber string, rec attemptRecord) error {
	m.attempts.set(subscriber, rec)
	return nil
}

func (m *MemoryCheckpointStore) failAttempt(_ context.Context, batch Batch, subscriber string, rec attemptRecord) error {
	m.attempts.fail(subscriber, rec)
	return rollbackIf(batch)
}

func (m *MemoryCheckpointStore) hasAttempt(_ context.Context, _ Batch, subscriber string, position int64) (bool, error) {
	return m.attempts.has(subscriber, position), nil
}

func (m *MemoryCheckpointStore) clearAttempt(_ context.Context, batch Batch, subscriber string) error {
	b, ok := batch.(*memoryBatch)
	if !ok {
		return fmt.Errorf("subscriptions: clear the attempt count of %q: not a batch of this store", subscriber)
	}
	b.clearAttempt = true
	return nil
}

// GormCheckpointStore: the records are rows of subscriber_attempts, one
// per checkpoint row. On Postgres they are written in statements of
// their own, committed at once, by the replica whose batch holds the
// checkpoint row's lock (the attempts row is not locked by the batch). On
// SQLite the batch holds the database's write lock, which no other
// connection can get: the batch's transaction itself writes the record,
// commits, and begins again (renew), still registered as the batch in
// flight, so no batch of this pool slips in between.

const attemptUpsert = `INSERT INTO subscriber_attempts (subscriber, position, event_id, through, attempts, last_error, updated_at)
	VALUES (?, ?, ?, ?, ?, ?, ?)
	ON CONFLICT (subscriber) DO UPDATE SET position = excluded.position, event_id = excluded.event_id, through = excluded.through,
		attempts = excluded.attempts, last_error = excluded.last_error, updated_at = excluded.updated_at`

type attemptRow struct {
	Position  int64
	EventID   string
	Through   int64
	Attempts  int
	LastError string
}

func (g *GormCheckpointStore) beginAttempt(ctx context.Context, batch Batch, subscriber string, rec attemptRecord) (attemptRecord, bool, error) {
	var prev attemptRecord
	found := false
	err := g.attemptWrite(ctx, batch, subscriber, func(db *gorm.DB) error {
		// One statement on the common path: the upsert writes unless a
		// record of an earlier attempt at rec is there (sameAttempt).
		var wrote []int
		if err := db.Raw(attemptUpsert+`
			WHERE NOT (subscriber_attempts.position = excluded.position
				AND (subscriber_attempts.event_id = excluded.event_id OR subscriber_attempts.attempts = 0))
			RETURNING attempts`,
			subscriber, rec.position, rec.eventID, rec.through, rec.attempts, rec.lastError, time.Now().UTC()).Scan(&wrote).Error; err != nil {
			return err
		}
		if len(wrote) == 1 {
			return nil
		}
		var rows []attemptRow
		if err := db.Raw("SELECT position, event_id, through, attempts, last_error FROM subscriber_attempts WHERE subscriber = ?", subscriber).Scan(&rows).Error; err != nil {
			return fmt.Errorf("read: %w", err)
		}
		if len(rows) != 1 {
			return errors.New("the record vanished")
		}
		r := rows[0]
		prev, found = attemptRecord{position: r.Position, eventID: r.EventID, through: r.Through, attempts: r.Attempts, lastError: r.LastError}, true
		return errNothingToWrite
	})
	if err != nil {
		return attemptRecord{}, false, err
	}
	return prev, found, nil
}

// errNothingToWrite ends an attemptWrite without a write to commit.
var errNothingToWrite = errors.New("nothing to write")

func (g *GormCheckpointStore) putAttempt(ctx context.Context, batch Batch, subscriber string, rec attemptRecord) error {
	return g.attemptWrite(ctx, batch, subscriber, func(db *gorm.DB) error {
		return db.Exec(attemptUpsert, subscriber, rec.position, rec.eventID, rec.through, rec.attempts, rec.lastError, time.Now().UTC()).Error
	})
}

// attemptConnWait bounds how long a Postgres batch waits for the second
// connection its attempt record is written on.
const attemptConnWait = 5 * time.Second

// secondConn (Postgres) runs fn on a connection of the pool other than
// the batch's, which holds its own meanwhile. With a bounded pool that
// every batch in flight holds a connection of, none may ever free up:
// after attemptConnWait the wait fails (the caller rolls the batch back,
// freeing its connection, and retries after the poll interval) instead of
// deadlocking the pool. The error says what to change.
func (g *GormCheckpointStore) secondConn(ctx context.Context, fn func(db *gorm.DB) error) error {
	if g.pool != nil && g.pool.Stats().MaxOpenConnections == 1 {
		return fmt.Errorf("the pool is limited to one connection, which the batch holds: %w", errNoSecondConn)
	}
	wait, cancel := context.WithTimeout(ctx, attemptConnWait)
	defer cancel()
	got := false
	err := g.db.WithContext(wait).Connection(func(conn *gorm.DB) error {
		got = true
		return fn(conn.WithContext(ctx))
	})
	if !got && err != nil && wait.Err() != nil && ctx.Err() == nil {
		return fmt.Errorf("no second connection free within %v (the batch holds one; give the pool one connection more than the batches it runs at once): %w: %w", attemptConnWait, errNoSecondConn, err)
	}
	return err
}

// errNoSecondConn marks an attempt record a Postgres batch could not
// write because its pool had no connection besides the batch's own. The
// attempt then runs counted in this process only (see fallbackAttempts),
// rather than failing the batch: a pool of one connection, or one
// exhausted by concurrent batches, must never stop a subscriber.
var errNoSecondConn = errors.New("no second connection for the attempt record")

// attemptWrite runs write committed before it returns: on Postgres as
// statements on the pool, outside the batch's transaction; on SQLite in
// the batch's transaction, which it then commits and renews (see above).
func (g *GormCheckpointStore) attemptWrite(ctx context.Context, batch Batch, subscriber string, write func(db *gorm.DB) error) error {
	wrap := func(err error) error {
		return fmt.Errorf("subscriptions: record an attempt of %q: %w", subscriber, err)
	}
	if g.dialect.RowLocks {
		if err := g.secondConn(ctx, write); err != nil && !errors.Is(err, errNothingToWrite) {
			return wrap(err)
		}
		return nil
	}
	b, ok := batch.(*gormBatch)
	if !ok || b.store != g {
		return wrap(errors.New("not a batch of this store"))
	}
	if err := b.renew(ctx, write); err != nil {
		return wrap(err)
	}
	return nil
}

func (g *GormCheckpointStore) failAttempt(ctx context.Context, batch Batch, subscriber string, rec attemptRecord) error {
	b, _ := batch.(*gormBatch)
	if batch != nil && (b == nil || b.store != g) {
		_ = batch.Rollback()
		return fmt.Errorf("subscriptions: record the failure of event %q of %q: not a batch of this store", rec.eventID, subscriber)
	}
	if b != nil && !g.dialect.RowLocks {
		// The batch holds SQLite's write lock: end its transaction, write
		// on its pinned connection in a statement of its own (the pool may
		// have no other connection), and only then let other batches in.
		defer b.release()
		b.finished = true
		b.abortMu.Lock()
		aborted := b.aborted
		var conn *sql.Conn
		if !aborted {
			rerr := b.tx.Rollback().Error
			b.aborted = true // nothing left for a Reset to end
			conn, b.conn = b.conn, nil
			if rerr != nil && conn != nil {
				cleanSQLiteConn(conn)
			}
		}
		b.abortMu.Unlock()
		if aborted {
			return nil // a Reset moved the checkpoint: nothing to record
		}
		if conn == nil {
			return failAttemptRow(g.db.WithContext(ctx), subscriber, rec)
		}
		defer conn.Close()
		db := g.db.Session(&gorm.Session{NewDB: true, Context: ctx})
		db.Statement.ConnPool = conn
		return failAttemptRow(db, subscriber, rec)
	}
	var err error
	if b != nil && g.dialect.RowLocks {
		err = g.secondConn(ctx, func(db *gorm.DB) error { return failAttemptRow(db, subscriber, rec) })
	} else {
		err = failAttemptRow(g.db.WithContext(ctx), subscriber, rec)
	}
	if b != nil && g.dialect.RowLocks {
		// Recorded while the batch still held the checkpoint row.
		if rerr := b.Rollback(); rerr != nil && err == nil {
			err = rerr
		}
	}
	return err
}

func failAttemptRow(db *gorm.DB, subscriber string, rec attemptRecord) error {
	err := db.Exec(`INSERT INTO subscriber_attempts (subscriber, position, event_id, through, attempts, last_error, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (subscriber) DO UPDATE SET last_error = excluded.last_error, updated_at = excluded.updated_at,
			attempts = CASE WHEN subscriber_attempts.position = excluded.position AND subscriber_attempts.event_id = excluded.event_id
				AND subscriber_attempts.through = excluded.through THEN subscriber_attempts.attempts ELSE excluded.attempts END,
			position = excluded.position, event_id = excluded.event_id, through = excluded.through`,
		subscriber, rec.position, rec.eventID, rec.through, rec.attempts, rec.lastError, time.Now().UTC()).Error
	if err != nil {
		return fmt.Errorf("subscriptions: record the failure of event %q of %q: %w", rec.eventID, subscriber, err)
	}
	return nil
}

func (g *GormCheckpointStore) hasAttempt(ctx context.Context, batch Batch, subscriber string, position int64) (bool, error) {
	b, ok := batch.(*gormBatch)
	if !ok || b.store != g {
		return false, fmt.Errorf("subscriptions: read the attempt record of %q: not a batch of this store", subscriber)
	}
	var found []int
	if err := b.tx.WithContext(ctx).Raw("SELECT 1 FROM subscriber_attempts WHERE subscriber = ? AND position = ?", subscriber, position).Scan(&found).Error; err != nil {
		return false, fmt.Errorf("subscriptions: read the attempt record of %q: %w", subscriber, err)
	}
	return len(found) > 0, nil
}

func (g *GormCheckpointStore) clearAttempt(ctx context.Context, batch Batch, subscriber string) error {
	b, ok := batch.(*gormBatch)
	if !ok || b.store != g {
		return fmt.Errorf("subscriptions: clear the attempt count of %q: not a batch of this store", subscriber)
	}
	if err := b.tx.WithContext(ctx).Exec("DELETE FROM subscriber_attempts WHERE subscriber = ?", subscriber).Error; err != nil {
		return fmt.Errorf("subscriptions: clear the attempt count of %q: %w", subscriber, err)
	}
	return nil
}

// clearAttemptsIn deletes the names' records in tx (Reset, ResetWith,
// Delete and their partitioned forms).
func clearAttemptsIn(tx *gorm.DB, names ...string) error {
	if err := tx.Exec("DELETE FROM subscriber_attempts WHERE subscriber IN ?", names).Error; err != nil {
		return fmt.Errorf("clear the attempt count: %w", err)
	}
	return nil
}

// renew (SQLite) runs write in the batch's transaction, commits it and
// begins the next one, taking the write lock again at once. The batch
// stays registered throughout, so no batch of this pool starts in between;
// a Reset that aborts the batch meanwhile wins as usual (the batch's
// Commit fails with ErrCheckpointMoved). If another process moved the
// checkpoint in between, renew fails with errAttemptMoved. It must run
// before the first HandlerContext.
func (b *gormBatch) renew(ctx context.Context, write func(db *gorm.DB) error) error {
	if b.htx != nil {
		return errors.New("the batch's handlers have started")
	}
	b.abortMu.Lock()
	defer b.abortMu.Unlock()
	if b.aborted {
		return errAttemptMoved
	}
	if err := write(b.tx.WithContext(ctx)); err != nil {
		if errors.Is(err, errNothingToWrite) {
			return nil
		}
		return err
	}
	if err := b.tx.Commit().Error; err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	// Begin again on the batch's pinned connection (see beginSQLite), so
	// that the batch keeps the one connection the store cleans and returns.
	g := b.store
	if b.conn == nil {
		b.aborted, b.tx = true, nil
		return errors.New("begin again: the batch has no pinned connection")
	}
	stx, err := b.conn.BeginTx(ctx, g.txOptions())
	if err != nil {
		b.aborted, b.tx = true, nil // nothing to roll back
		return fmt.Errorf("begin again: %w", err)
	}
	tx := g.db.Session(&gorm.Session{NewDB: true, Context: ctx})
	tx.Statement.ConnPool = stx
	b.tx = tx
	if err := tx.Exec("UPDATE subscriber_checkpoints SET position = position WHERE subscriber = ?", b.subscriber).Error; err != nil {
		return fmt.Errorf("take the write lock again: %w", err)
	}
	var positions []int64
	if err := tx.Raw("SELECT position FROM subscriber_checkpoints WHERE subscriber = ?", b.subscriber).Scan(&positions).Error; err != nil {
		return fmt.Errorf("read the checkpoint again: %w", err)
	}
	if len(positions) != 1 || positions[0] != b.position {
		b.moved.Store(true)
		return errAttemptMoved
	}
	return nil
}
