package subscriptions

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/eventrow"
)

// gormBatch is one transaction of a GormCheckpointStore.
type gormBatch struct {
	store      *GormCheckpointStore
	subscriber string
	tx         *gorm.DB
	position   int64
	// marks are the row's delivery marks, read with its lock.
	marks DeliveryMarks
	// attempt is the attempt record a pipelined acquire read with the
	// lock, for the batch's first HasAttempt.
	attempt prefetchedAttempt
	// conn is the pooled connection the batch's transaction is pinned to,
	// closed when the batch ends (see closeConn): the batch's attempt
	// records are written on it too (renew), never on a second one.
	conn *sql.Conn
	// claim (Postgres) is the holder of the attempt claim the batch
	// committed (see checkpoint_gorm_attempts.go), released when the batch
	// rolls back; "" when it wrote none.
	claim string

	moved atomic.Bool // SQLite: a Reset moved the checkpoint under this batch
	// htx is the handlers' view of tx and guard its connection, made by
	// the first HandlerContext.
	htx      *gorm.DB
	guard    *handlerConn
	finished bool
	once     sync.Once
	done     chan struct{} // closed when the batch has ended

	// SQLite: a Reset ends the batch's transaction itself (abortForReset),
	// from the Reset's goroutine, so that it never waits for the batch's
	// owner. abortMu orders that against beginSQLite publishing the
	// transaction.
	abortMu sync.Mutex
	aborted bool
	// turn (SQLite) ends the batch's turn on the database file
	// (GormCheckpointStore.queue), once its transaction has ended.
	turn func()
}

// abortForReset marks the batch as moved and rolls its transaction back
// at once, releasing SQLite's write lock (and, on a one-connection pool,
// the connection) for the Reset. A statement the batch is running is
// interrupted (database/sql cancels the transaction's context); every later
// statement and the Commit fail, and the owner's Commit returns
// ErrCheckpointMoved. It is called by Reset's goroutine while the owner may
// be using the transaction: only the *sql.Tx is touched, which is safe for
// that, never the shared *gorm.DB.
func (b *gormBatch) abortForReset() {
	b.moved.Store(true)
	b.abortMu.Lock()
	b.aborted = true
	tx, conn := b.tx, b.conn
	b.abortMu.Unlock()
	if tx == nil {
		return // beginSQLite sees aborted and gives the batch up
	}
	committer, ok := tx.Statement.ConnPool.(gorm.TxCommitter)
	if !ok {
		return
	}
	err := committer.Rollback()
	if errors.Is(err, sql.ErrTxDone) || conn == nil {
		// The owner ended the transaction (it cleans and returns the
		// connection itself), or the batch found it ended by a statement.
		return
	}
	// The transaction was live and is rolled back: hand the pinned
	// connection back to the pool now, for the Reset (a one-connection
	// pool has no other); the owner's later statements fail with
	// sql.ErrTxDone and its Close with sql.ErrConnDone.
	if err != nil {
		cleanSQLiteConn(conn)
	}
	_ = conn.Close()
}

// closeConn returns the batch's pinned SQLite connection to the pool once
// its transaction has ended. After a failed COMMIT (or ROLLBACK) the SQLite
// transaction can still be open on it — github.com/glebarez/go-sqlite
// leaves it so, and the next user of the connection would then write
// inside the stale transaction — so the connection is cleaned first (see
// cleanSQLiteConn).
func (b *gormBatch) closeConn(endFailed bool) {
	if b.conn == nil {
		return
	}
	if endFailed && !b.store.dialect.RowLocks {
		cleanSQLiteConn(b.conn)
	}
	_ = b.conn.Close() // sql.ErrConnDone when a Reset closed it
}

// cleanSQLiteConn leaves conn in autocommit, with no transaction open, or
// discards it: ROLLBACK ends a transaction still open; when that fails
// (no transaction was open, as github.com/mattn/go-sqlite3 leaves it after
// a failed COMMIT, or the rollback itself failed) BEGIN tells which, since
// SQLite refuses it only inside a transaction. A connection that cannot be
// brought back to autocommit is closed instead of going back to the pool
// (database/sql discards it on driver.ErrBadConn).
func cleanSQLiteConn(conn *sql.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err == nil {
		return
	}
	if _, err := conn.ExecContext(ctx, "BEGIN"); err == nil {
		if _, err := conn.ExecContext(ctx, "ROLLBACK"); err == nil {
			return
		}
	}
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
}

// abortedByReset reports whether a Reset ended the batch's transaction.
func (b *gormBatch) abortedByReset() bool {
	b.abortMu.Lock()
	defer b.abortMu.Unlock()
	return b.aborted
}

var (
	_ ResetAborter = (*gormBatch)(nil)
	_ TxEndChecker = (*gormBatch)(nil)
	_ MarkedBatch  = (*gormBatch)(nil)
)

// DeliveryMarks returns the marks the batch read with its checkpoint row
// (see MarkedBatch).
func (b *gormBatch) DeliveryMarks() DeliveryMarks { return b.marks }

// AbortedByReset reports whether a Reset ended the batch (SQLite; see
// ResetAborter): a handler error or failed statement in it is the reset's
// doing, not the event's, and must not count as a failed attempt.
func (b *gormBatch) AbortedByReset() bool { return b.abortedByReset() }

// release ends the batch's registration and its turn (SQLite) and wakes
// a waiting Reset. Every end of a batch calls it, after its transaction.
func (b *gormBatch) release() {
	b.once.Do(func() {
		if b.turn != nil {
			b.turn()
		}
		if b.store != nil && b.store.reg != nil {
			reg := b.store.reg
			reg.mu.Lock()
			if reg.active[b.subscriber] == b {
				delete(reg.active, b.subscriber)
			}
			reg.mu.Unlock()
		}
		close(b.done)
	})
}

func (b *gormBatch) Position() int64 { return b.position }

// HandlerContext attaches the batch transaction, guarded so that a
// handler cannot end it (see handlerConn): Commit then fails the batch.
func (b *gormBatch) HandlerContext(ctx context.Context) context.Context {
	if b.htx == nil {
		b.attempt = prefetchedAttempt{} // handlers may write anything
		b.htx, b.guard = guardTx(b.tx, b.store.pool, !b.store.dialect.RowLocks)
	}
	return withBatchTx(ctx, b.htx, b.store.pool, b.conn)
}

func (b *gormBatch) Commit(ctx context.Context, position int64) error {
	if b.finished {
		return fmt.Errorf("subscriptions: commit checkpoint of %q: %w", b.subscriber, ErrBatchFinished)
	}
	b.finished = true
	endFailed := false
	defer func() {
		b.closeConn(endFailed)
		b.release()
	}()
	if b.abortedByReset() {
		return fmt.Errorf("subscriptions: commit checkpoint of %q at position %d: %w", b.subscriber, position, ErrCheckpointMoved)
	}
	fail := func(err error) error {
		if rerr := b.tx.Rollback().Error; rerr != nil && !errors.Is(rerr, sql.ErrTxDone) {
			endFailed = true
		}
		if b.abortedByReset() {
			// A Reset rolled the transaction back under this Commit.
			err = ErrCheckpointMoved
		}
		return fmt.Errorf("subscriptions: commit checkpoint of %q at position %d: %w", b.subscriber, position, err)
	}
	if position < b.position {
		return fail(fmt.Errorf("position is behind the batch's start %d", b.position))
	}
	if b.moved.Load() {
		return fail(ErrCheckpointMoved)
	}
	if err := b.guard.misused(); err != nil {
		return fail(staged(stageHandlers, err))
	}
	if !b.store.dialect.RowLocks {
		// Never let the checkpoint UPDATE run in autocommit (see
		// handlerConn.watchTx): one question per batch.
		if err := b.txEnded(ctx); err != nil {
			return fail(staged(stageHandlers, err))
		}
	}
	// The compare-and-set also refuses while the name is paused: a batch
	// that locked its row before a Pause committed never moves the
	// checkpoint after Pause returned (see GormCheckpointStore.pause).
	update, args := b.store.sql.commitUpdate, []any{position, time.Now().UTC(), b.subscriber, b.position, PauseKey(b.subscriber)}
	if b.claim != "" && b.store.dialect.Claims {
		// The batch's attempt claim goes in the same statement (see
		// AttemptCounter): once the commit lands, its record is a plain
		// record of the position it committed.
		update = b.store.sql.commitUpdateClaim
		args = append([]any{b.subscriber, b.claim}, args...)
	}
	var (
		affected int64
		err      error
	)
	if pinned, ok := b.tx.Statement.ConnPool.(*pinnedTx); ok {
		// A pipelined batch: straight on its pgx session (see
		// pinnedTx.exec).
		affected, err = pinned.exec(ctx, update.pgx, args...)
	} else {
		res := b.tx.WithContext(ctx).Exec(update.gorm, args...)
		affected, err = res.RowsAffected, res.Error
	}
	if err != nil {
		return fail(staged(stageLibrary, err))
	}
	if affected != 1 {
		return fail(ErrCheckpointMoved) // reset, or paused meanwhile
	}
	if err := b.tx.Commit().Error; err != nil {
		endFailed = true
		if b.abortedByReset() {
			err = ErrCheckpointMoved
		}
		return fmt.Errorf("subscriptions: commit checkpoint of %q at position %d: %w", b.subscriber, position, err)
	}
	return nil
}

// statement is one statement in GORM's placeholders (?) and in pgx's ($n).
type statement struct{ gorm, pgx string }

// newStatement numbers the ? placeholders of sql for pgx; sql has no ?
// elsewhere.
func newStatement(sql string) statement {
	var b strings.Builder
	n := 0
	for _, r := range sql {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return statement{gorm: sql, pgx: b.String()}
}

// commitStatements are Commit's compare-and-set of the checkpoint on the
// tables t, update: the new position, the time, the row, the batch's
// start and the pause key; and claim, update releasing the batch's
// attempt claim (releaseClaimQuery: the subscriber and the holder first)
// in the same statement.
func commitStatements(t gormTables) (update, claim statement) {
	update = newStatement("UPDATE " + t.checkpoints + " SET position = ?, updated_at = ? WHERE subscriber = ? AND position = ? AND NOT " + pausedClause(t, "?"))
	return update, newStatement("WITH released AS (" + releaseClaimQuery(t) + ") " + update.gorm)
}

func (b *gormBatch) Rollback() error {
	if b.finished {
		return fmt.Errorf("subscriptions: roll back batch of %q: %w", b.subscriber, ErrBatchFinished)
	}
	b.finished = true
	endFailed := false
	defer func() {
		b.closeConn(endFailed)
		b.release()
	}()
	if b.abortedByReset() {
		return nil // already rolled back by the Reset
	}
	if err := b.tx.Rollback().Error; err != nil {
		if errors.Is(err, sql.ErrTxDone) && b.guard.endedByStatement() {
			return nil // ended when the statement was found out
		}
		endFailed = true
		return fmt.Errorf("subscriptions: roll back batch of %q: %w", b.subscriber, err)
	}
	if b.claim != "" && b.store.dialect.Claims && b.conn != nil {
		return b.store.releaseClaim(b.conn, b.subscriber, b.claim)
	}
	return nil
}

// txEnded (SQLite) returns the error recording that a statement ended the
// batch transaction behind its back, asking SQLite (see
// handlerConn.watchTx); nil when it stands.
func (b *gormBatch) txEnded(ctx context.Context) error {
	if b.guard != nil {
		return b.guard.checkTx(ctx)
	}
	if !txStands(ctx, b.tx.Statement.ConnPool) {
		return fmt.Errorf("subscriptions: %w", errTxEndedByStatement)
	}
	return nil
}

// HandlerEndedTx implements TxEndChecker (see handlerConn.watchTx).
func (b *gormBatch) HandlerEndedTx(ctx context.Context) error {
	return b.guard.afterHandler(ctx)
}

// savepointName restricts savepoint names to plain identifiers: GORM
// builds SAVEPOINT statements by string concatenation.
var savepointName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

func (b *gormBatch) Savepoint(ctx context.Context, name string) error {
	if !savepointName.MatchString(name) {
		return fmt.Errorf("subscriptions: savepoint name %q is not a plain identifier", name)
	}
	if err := b.tx.WithContext(ctx).SavePoint(name).Error; err != nil {
		return fmt.Errorf("subscriptions: savepoint %s in batch of %q: %w", name, b.subscriber, err)
	}
	return nil
}

func (b *gormBatch) RollbackToSavepoint(ctx context.Context, name string) error {
	if !savepointName.MatchString(name) {
		return fmt.Errorf("subscriptions: savepoint name %q is not a plain identifier", name)
	}
	if err := b.tx.WithContext(ctx).RollbackTo(name).Error; err != nil {
		return fmt.Errorf("subscriptions: roll back to savepoint %s in batch of %q: %w", name, b.subscriber, err)
	}
	// A Commit or Rollback a handler attempted after the savepoint went
	// with the attempt it belonged to.
	b.guard.forget()
	return nil
}

var _ BatchFeedReader = (*gormBatch)(nil)

// ReadPositions reads the events at positions in the batch's transaction,
// for a feed the store shares (SharesFeed): a partition's events after
// its lock, on the batch's connection.
func (b *gormBatch) ReadPositions(ctx context.Context, positions []int64) ([]domain.EventEnvelope[any], error) {
	if len(positions) == 0 {
		return []domain.EventEnvelope[any]{}, nil
	}
	where, args := b.store.dialect.PositionIn(positions)
	events, err := eventrow.ReadFrom(ctx, b.tx, b.store.sql.events, "WHERE "+where+" ORDER BY position", args...)
	if err != nil {
		return nil, fmt.Errorf("subscriptions: read %d events of the feed in the batch of %q: %w", len(positions), b.subscriber, err)
	}
	return events, nil
}
