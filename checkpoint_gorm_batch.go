package subscriptions

import (
	"context"
	"fmt"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"
)

// gormBatch is one transaction of a GormCheckpointStore.
type gormBatch struct {
	store      *GormCheckpointStore
	subscriber string
	tx         *gorm.DB
	position   int64

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
	tx := b.tx
	b.abortMu.Unlock()
	if tx == nil {
		return // beginSQLite sees aborted and gives the batch up
	}
	if committer, ok := tx.Statement.ConnPool.(gorm.TxCommitter); ok {
		_ = committer.Rollback() // ErrTxDone if it already ended: nothing to release
	}
}

// abortedByReset reports whether a Reset ended the batch's transaction.
func (b *gormBatch) abortedByReset() bool {
	b.abortMu.Lock()
	defer b.abortMu.Unlock()
	return b.aborted
}

// resetAborted reports whether batch is a GormCheckpointStore batch that a
// Reset aborted: a handler error or failed statement in it is the reset's
// doing, not the event's, and must not count as a failed attempt.
func resetAborted(batch Batch) bool {
	b, ok := batch.(*gormBatch)
	return ok && b.abortedByReset()
}

// release ends the batch's registration (SQLite) and wakes a waiting Reset.
func (b *gormBatch) release() {
	b.once.Do(func() {
		if b.store != nil && !b.store.postgres {
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
		b.htx, b.guard = guardTx(b.tx, b.store.pool)
	}
	return withTx(ctx, b.htx, b.store.pool)
}

func (b *gormBatch) Commit(ctx context.Context, position int64) error {
	if b.finished {
		return fmt.Errorf("subscriptions: commit checkpoint of %q: %w", b.subscriber, ErrBatchFinished)
	}
	b.finished = true
	defer b.release()
	if b.abortedByReset() {
		return fmt.Errorf("subscriptions: commit checkpoint of %q at position %d: %w", b.subscriber, position, ErrCheckpointMoved)
	}
	fail := func(err error) error {
		b.tx.Rollback()
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
		return fail(err)
	}
	res := b.tx.WithContext(ctx).Exec("UPDATE subscriber_checkpoints SET position = ?, updated_at = ? WHERE subscriber = ? AND position = ?",
		position, time.Now().UTC(), b.subscriber, b.position)
	if res.Error != nil {
		return fail(res.Error)
	}
	if res.RowsAffected != 1 {
		return fail(ErrCheckpointMoved)
	}
	if err := b.tx.Commit().Error; err != nil {
		if b.abortedByReset() {
			err = ErrCheckpointMoved
		}
		return fmt.Errorf("subscriptions: commit checkpoint of %q at position %d: %w", b.subscriber, position, err)
	}
	return nil
}

func (b *gormBatch) Rollback() error {
	if b.finished {
		return fmt.Errorf("subscriptions: roll back batch of %q: %w", b.subscriber, ErrBatchFinished)
	}
	b.finished = true
	defer b.release()
	if b.abortedByReset() {
		return nil // already rolled back by the Reset
	}
	if err := b.tx.Rollback().Error; err != nil {
		return fmt.Errorf("subscriptions: roll back batch of %q: %w", b.subscriber, err)
	}
	return nil
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
