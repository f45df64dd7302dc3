package subscriptions

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/internal/dialect"
)

// GormCheckpointStore's attempt records (see AttemptCounter) are rows of
// subscriber_attempts, one per checkpoint row. A batch writes its record
// on its own pinned connection: its transaction writes the record,
// commits, begins again and takes the checkpoint row again (renew), so
// that the record is committed before the handlers run and nothing ever
// waits for a second connection while it holds one (doc.go,
// "Connections").
//
// On SQLite the batch stays registered as the batch in flight meanwhile,
// so no batch of this pool slips in between. On Postgres another replica
// can take the row lock in that moment (a round trip); the record's claim
// keeps it out: a record written for an attempt names its runner
// (holder), the server process of the connection that wrote it
// (holder_pid) and the server's clock (claimed_at), and another replica
// that takes the row treats it as held while the claim is live (see
// dialect.LiveClaim): the process is still there and the claim younger
// than attemptClaimLease. A crash ends the claim with the process's
// connections; a claim whose batch rolled back is released at once
// (gormBatch.Rollback); the lease bounds what neither covers (a server
// process that outlives its client, as behind a pooler).

// attemptClaimLease bounds how long an attempt claim keeps other replicas
// from a checkpoint whose row nobody locks (see above). It only has to
// outlast the moment between the record's commit and the row lock taken
// again (dialect.Relock waits up to 5 s for it); a claim of a live batch
// is never looked at, since its batch holds the row.
const attemptClaimLease = 10 * time.Second

var _ AttemptCounter = (*GormCheckpointStore)(nil)

// attemptUpsertQuery writes a whole record into t's attempts, with the
// claim where the dialect d has claims; its arguments are attemptValues'.
func attemptUpsertQuery(t gormTables, d *dialect.Dialect) string {
	columns, values, set := "", "", ""
	if d.Claims {
		pid, now := d.ClaimValues()
		columns, values = ", holder, holder_pid, claimed_at", ", ?, "+pid+", "+now
		set = ", holder = excluded.holder, holder_pid = excluded.holder_pid, claimed_at = excluded.claimed_at"
	}
	return `INSERT INTO ` + t.attempts + ` (subscriber, position, event_id, through, attempts, last_error, updated_at` + columns + `)
	VALUES (?, ?, ?, ?, ?, ?, ?` + values + `)
	ON CONFLICT (subscriber) DO UPDATE SET position = excluded.position, event_id = excluded.event_id, through = excluded.through,
		attempts = excluded.attempts, last_error = excluded.last_error, updated_at = excluded.updated_at` + set
}

func (g *GormCheckpointStore) attemptValues(subscriber string, rec AttemptRecord) []any {
	values := []any{subscriber, rec.Position, rec.EventID, rec.Through, rec.Attempts, rec.LastError, time.Now().UTC()}
	if g.dialect.Claims {
		values = append(values, rec.Holder)
	}
	return values
}

// liveClaim is the condition that another runner than holder claims the
// subscriber's record for an attempt from checkpoint (the position of the
// batch asking).
func (g *GormCheckpointStore) liveClaim(holder string, checkpoint int64) (string, []any) {
	return g.dialect.LiveClaim("subscriber_attempts", holder, checkpoint, attemptClaimLease)
}

type attemptRow struct {
	Position  int64
	EventID   string
	Through   int64
	Attempts  int
	LastError string
	Holder    string
	Claimed   bool
}

func (g *GormCheckpointStore) BeginAttempt(ctx context.Context, batch Batch, subscriber string, rec AttemptRecord) (AttemptRecord, bool, error) {
	var prev AttemptRecord
	found := false
	err := g.attemptWrite(ctx, batch, subscriber, rec.Holder, func(db *gorm.DB, checkpoint int64) error {
		// One statement on the common path: the upsert writes unless a
		// record of an earlier attempt at rec (sameAttempt) or another
		// runner's live claim is there.
		live, liveArgs := g.liveClaim(rec.Holder, checkpoint)
		var wrote []int
		if err := db.Raw(g.sql.attemptUpsert+`
			WHERE NOT ((subscriber_attempts.position = excluded.position
				AND (subscriber_attempts.event_id = excluded.event_id OR subscriber_attempts.attempts = 0)) OR `+live+`)
			RETURNING attempts`, append(g.attemptValues(subscriber, rec), liveArgs...)...).Scan(&wrote).Error; err != nil {
			return err
		}
		if len(wrote) == 1 {
			return nil
		}
		holder := "''"
		if g.dialect.Claims {
			holder = "holder"
		}
		var rows []attemptRow
		if err := db.Raw("SELECT position, event_id, through, attempts, last_error, "+holder+" AS holder, "+live+" AS claimed FROM "+g.sql.attempts+" WHERE subscriber = ?",
			append(liveArgs, subscriber)...).Scan(&rows).Error; err != nil {
			return fmt.Errorf("read: %w", err)
		}
		if len(rows) != 1 {
			return errors.New("the record vanished")
		}
		r := rows[0]
		if r.Claimed {
			return ErrAttemptClaimed
		}
		prev, found = AttemptRecord{Position: r.Position, EventID: r.EventID, Through: r.Through, Attempts: r.Attempts, LastError: r.LastError, Holder: r.Holder}, true
		return errNothingToWrite
	})
	if err != nil {
		return AttemptRecord{}, false, err
	}
	return prev, found, nil
}

// errNothingToWrite ends an attemptWrite without a write to commit.
var errNothingToWrite = errors.New("nothing to write")

func (g *GormCheckpointStore) PutAttempt(ctx context.Context, batch Batch, subscriber string, rec AttemptRecord) error {
	return g.attemptWrite(ctx, batch, subscriber, rec.Holder, func(db *gorm.DB, checkpoint int64) error {
		live, liveArgs := g.liveClaim(rec.Holder, checkpoint)
		res := db.Exec(g.sql.attemptUpsert+" WHERE NOT "+live, append(g.attemptValues(subscriber, rec), liveArgs...)...)
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected == 0 {
			return ErrAttemptClaimed
		}
		return nil
	})
}

// attemptWrite runs write in batch's transaction and commits it before
// it returns (renew), unless write answers errNothingToWrite. checkpoint
// is the batch's position. A record with a holder is the batch's claim,
// which its Rollback releases.
func (g *GormCheckpointStore) attemptWrite(ctx context.Context, batch Batch, subscriber, holder string, write func(db *gorm.DB, checkpoint int64) error) error {
	wrap := func(err error) error {
		return fmt.Errorf("subscriptions: record an attempt of %q: %w", subscriber, err)
	}
	b, ok := batch.(*gormBatch)
	if !ok || b.store != g {
		return wrap(errors.New("not a batch of this store"))
	}
	wrote, err := b.renew(ctx, func(db *gorm.DB) error { return write(db, b.position) })
	if wrote && holder != "" && g.dialect.Claims {
		b.claim = holder
	}
	if err != nil {
		return wrap(err)
	}
	return nil
}

func (g *GormCheckpointStore) FailAttempt(ctx context.Context, batch Batch, subscriber string, rec AttemptRecord) error {
	if batch == nil {
		return g.failAttemptRow(g.db.WithContext(ctx), subscriber, rec)
	}
	b, ok := batch.(*gormBatch)
	if !ok || b.store != g {
		_ = batch.Rollback()
		return fmt.Errorf("subscriptions: record the failure of event %q of %q: not a batch of this store", rec.EventID, subscriber)
	}
	// End the batch's transaction, write on its pinned connection in a
	// statement of its own (the pool may have no other), and only then let
	// other batches in: on SQLite by ending the batch's registration, on
	// Postgres by replacing the batch's claim, if any, with the failure.
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
			if g.dialect.RowLocks {
				_ = conn.Close() // a lost connection: write on the pool
				conn = nil
			} else {
				cleanSQLiteConn(conn)
			}
		}
	}
	b.abortMu.Unlock()
	if aborted {
		return nil // a Reset moved the checkpoint: nothing to record
	}
	if conn == nil {
		return g.failAttemptRow(g.db.WithContext(ctx), subscriber, rec)
	}
	defer conn.Close()
	db := g.db.Session(&gorm.Session{NewDB: true, Context: ctx})
	db.Statement.ConnPool = conn
	return g.failAttemptRow(db, subscriber, rec)
}

// failAttemptRow writes the failure rec records, unclaimed: on the record
// of the same attempt keeping its count, else as a new record of
// rec.attempts. Another runner's live claim is left alone: that runner
// is attempting now and counts on its own.
func (g *GormCheckpointStore) failAttemptRow(db *gorm.DB, subscriber string, rec AttemptRecord) error {
	live, liveArgs := g.liveClaim(rec.Holder, rec.Position)
	unclaim := ""
	if g.dialect.Claims {
		unclaim = ", holder = '', holder_pid = 0, claimed_at = NULL"
	}
	err := db.Exec(`INSERT INTO `+g.sql.attempts+` (subscriber, position, event_id, through, attempts, last_error, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (subscriber) DO UPDATE SET last_error = excluded.last_error, updated_at = excluded.updated_at,
			attempts = CASE WHEN subscriber_attempts.position = excluded.position AND subscriber_attempts.event_id = excluded.event_id
				AND subscriber_attempts.through = excluded.through THEN subscriber_attempts.attempts ELSE excluded.attempts END,
			position = excluded.position, event_id = excluded.event_id, through = excluded.through`+unclaim+`
		WHERE NOT `+live,
		append([]any{subscriber, rec.Position, rec.EventID, rec.Through, rec.Attempts, rec.LastError, time.Now().UTC()}, liveArgs...)...).Error
	if err != nil {
		return fmt.Errorf("subscriptions: record the failure of event %q of %q: %w", rec.EventID, subscriber, err)
	}
	return nil
}

// releaseClaimQuery gives up the claim of a holder (the second argument)
// on the subscriber's record (the first), in t's attempts.
func releaseClaimQuery(t gormTables) string {
	return "UPDATE " + t.attempts + " SET holder = '' WHERE subscriber = ? AND holder = ?"
}

// releaseClaim (Postgres) gives up the claim holder wrote for the batch
// on conn, once the batch's transaction has rolled back: the record stays,
// an attempt that did not complete, and the next replica counts on from
// it at once instead of waiting for the claim to age.
func (g *GormCheckpointStore) releaseClaim(conn *sql.Conn, subscriber, holder string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := g.db.Session(&gorm.Session{NewDB: true, Context: ctx})
	db.Statement.ConnPool = conn
	if err := db.Exec(g.sql.releaseClaim, subscriber, holder).Error; err != nil {
		return fmt.Errorf("subscriptions: release the attempt claim of %q: %w", subscriber, err)
	}
	return nil
}

func (g *GormCheckpointStore) HasAttempt(ctx context.Context, batch Batch, subscriber string, position int64) (bool, error) {
	b, ok := batch.(*gormBatch)
	if !ok || b.store != g {
		return false, fmt.Errorf("subscriptions: read the attempt record of %q: not a batch of this store", subscriber)
	}
	if has, ok := b.attempt.take(subscriber == b.subscriber, position); ok {
		return has, nil
	}
	var found []int
	if err := b.tx.WithContext(ctx).Raw("SELECT 1 FROM "+g.sql.attempts+" WHERE subscriber = ? AND position = ?", subscriber, position).Scan(&found).Error; err != nil {
		return false, fmt.Errorf("subscriptions: read the attempt record of %q: %w", subscriber, err)
	}
	return len(found) > 0, nil
}

func (g *GormCheckpointStore) ClearAttempt(ctx context.Context, batch Batch, subscriber string) error {
	b, ok := batch.(*gormBatch)
	if !ok || b.store != g {
		return fmt.Errorf("subscriptions: clear the attempt count of %q: not a batch of this store", subscriber)
	}
	b.attempt = prefetchedAttempt{}
	if err := b.tx.WithContext(ctx).Exec("DELETE FROM "+g.sql.attempts+" WHERE subscriber = ?", subscriber).Error; err != nil {
		return fmt.Errorf("subscriptions: clear the attempt count of %q: %w", subscriber, err)
	}
	return nil
}

// prefetchedAttempt is the subscriber's attempt record as a pipelined
// acquire read it, in the batch's transaction once the row was locked
// (sendAcquireBatch): it answers the batch's first HasAttempt without a
// round trip. It is what that read would have returned a moment later:
// the batch has written nothing since (any write through the batch, and
// the first HandlerContext, drop it), and what other transactions commit
// meanwhile is no more ordered with the batch's read than it was. The
// zero value knows nothing. It belongs to the batch's goroutine.
type prefetchedAttempt struct {
	known, exists bool
	position      int64 // the record's position, when exists
}

// take answers HasAttempt at position for the batch's own subscriber
// (own), once: ok is false when the read must run.
func (p *prefetchedAttempt) take(own bool, position int64) (has, ok bool) {
	if !p.known || !own {
		return false, false
	}
	has = p.exists && p.position == position
	*p = prefetchedAttempt{}
	return has, true
}

// clearAttemptsIn deletes the names' records in tx (Reset, ResetWith,
// Delete and their partitioned forms).
func (t gormTables) clearAttemptsIn(tx *gorm.DB, names ...string) error {
	if err := tx.Exec("DELETE FROM "+t.attempts+" WHERE subscriber IN ?", names).Error; err != nil {
		return fmt.Errorf("clear the attempt count: %w", err)
	}
	return nil
}

// relock takes the batch's checkpoint row again in its new transaction tx
// (see checkpoint_gorm_lock.go): on Postgres waiting for it, up to
// relockTimeout (the transaction's own lock timeout restored after), on
// SQLite by taking the write lock.
func (b *gormBatch) relock(tx *gorm.DB) (lockedRow, error) {
	var row lockedRow
	if !b.store.dialect.RowLocks {
		if err := tx.Exec(b.store.sql.takeWriteLock, b.subscriber).Error; err != nil {
			return row, err
		}
		return row, tx.Raw(b.store.sql.readLockedRow, lockRowArgs(b.subscriber)...).Scan(&row).Error
	}
	if err := tx.Exec("SET LOCAL lock_timeout = '" + relockTimeout + "'").Error; err != nil {
		return row, err
	}
	if err := tx.Raw(b.store.sql.relockRow, lockRowArgs(b.subscriber)...).Scan(&row).Error; err != nil {
		return row, err
	}
	return row, tx.Exec("SET LOCAL lock_timeout TO DEFAULT").Error
}

// renew runs write in the batch's transaction, commits it and begins the
// next one on the batch's pinned connection, taking the checkpoint row
// again at once (relock). wrote is false when write answered
// errNothingToWrite (nothing is committed then). On SQLite the batch stays
// registered throughout, so no batch of this pool starts in between; a
// Reset that aborts the batch meanwhile wins as usual (the batch's Commit
// fails with ErrCheckpointMoved). If the checkpoint moved in between (a
// Reset, or another replica's commit), renew fails with errAttemptMoved.
// It must run before the first HandlerContext.
func (b *gormBatch) renew(ctx context.Context, write func(db *gorm.DB) error) (wrote bool, err error) {
	if b.htx != nil {
		return false, errors.New("the batch's handlers have started")
	}
	b.attempt = prefetchedAttempt{}
	b.abortMu.Lock()
	defer b.abortMu.Unlock()
	if b.aborted {
		return false, errAttemptMoved
	}
	if err := write(b.tx.WithContext(ctx)); err != nil {
		if errors.Is(err, errNothingToWrite) {
			return false, nil
		}
		return false, err
	}
	if err := b.tx.Commit().Error; err != nil {
		return false, fmt.Errorf("commit: %w", err)
	}
	g := b.store
	if b.conn == nil {
		b.aborted, b.tx = true, nil // nothing to roll back
		return true, errors.New("begin again: the batch has no pinned connection")
	}
	stx, err := b.conn.BeginTx(ctx, g.txOptions())
	if err != nil {
		b.aborted, b.tx = true, nil
		return true, fmt.Errorf("begin again: %w", err)
	}
	tx := g.db.Session(&gorm.Session{NewDB: true, Context: ctx})
	tx.Statement.ConnPool = stx
	b.tx = tx
	row, err := b.relock(tx)
	if err != nil {
		return true, fmt.Errorf("take the checkpoint again: %w", err)
	}
	if row.Position == nil || *row.Position != b.position {
		b.moved.Store(true)
		return true, errAttemptMoved
	}
	if row.Paused {
		return true, ErrAttemptClaimed // as if held: nothing runs while paused
	}
	return true, nil
}
