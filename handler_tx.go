package subscriptions

import (
	"context"
	"database/sql"
	"fmt"
	"sync"

	"gorm.io/gorm"
)

// handlerConn is the connection of the transaction handed to handlers
// (TxFromContext). Statements go through to the batch transaction; Commit
// and Rollback do not. The transaction belongs to the batch, which commits
// it together with the checkpoint: a handler that ended it would commit
// its writes without the checkpoint (so they would be applied again) or
// drop the writes of the events before it, and the batch would then run
// on a finished transaction. Instead the call returns an error wrapping
// sql.ErrTxDone, nothing is ended, and the misuse is recorded so that the
// attempt fails as a whole (misused) whatever the handler does with the
// error.
//
// Handlers run on the batch's goroutine, but one may hand the transaction
// to another goroutine; the record is therefore guarded by a mutex.
type handlerConn struct {
	gorm.ConnPool // the batch transaction: *sql.Tx or *pinnedTx
	pool          *sql.DB

	mu     sync.Mutex
	misuse error
}

var (
	_ gorm.ConnPool       = (*handlerConn)(nil)
	_ gorm.TxCommitter    = (*handlerConn)(nil)
	_ gorm.GetDBConnector = (*handlerConn)(nil)
)

// guardTx returns the handler's view of the batch transaction tx, begun on
// pool. It keeps tx's statement context.
func guardTx(tx *gorm.DB, pool *sql.DB) (*gorm.DB, *handlerConn) {
	conn := &handlerConn{ConnPool: tx.Statement.ConnPool, pool: pool}
	h := tx.Session(&gorm.Session{NewDB: true, Context: tx.Statement.Context})
	h.Statement.ConnPool = conn
	return h, conn
}

// Commit refuses to commit the batch transaction from a handler.
func (c *handlerConn) Commit() error { return c.refuse("Commit") }

// Rollback refuses to roll back the batch transaction from a handler.
func (c *handlerConn) Rollback() error { return c.refuse("Rollback") }

func (c *handlerConn) refuse(op string) error {
	err := fmt.Errorf("subscriptions: a handler called %s on the batch transaction (TxFromContext), which the batch owns and ends with the checkpoint; return an error to discard the attempt's writes: %w", op, sql.ErrTxDone)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.misuse == nil {
		c.misuse = err
	}
	return err
}

// misused returns the first Commit or Rollback a handler attempted, or nil.
func (c *handlerConn) misused() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.misuse
}

// forget drops the record of a misuse whose attempt was discarded (rolled
// back to a savepoint taken before it).
func (c *handlerConn) forget() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.misuse = nil
}

// GetDBConn returns the pool the transaction was begun on, as gorm's DB()
// does for a plain transaction.
func (c *handlerConn) GetDBConn() (*sql.DB, error) {
	if c.pool == nil {
		return nil, gorm.ErrInvalidDB
	}
	return c.pool, nil
}

// handlerContext attaches the handler's view of tx to ctx; the returned
// handlerConn tells afterwards whether a handler tried to end tx.
func handlerContext(ctx context.Context, tx *gorm.DB, pool *sql.DB) (context.Context, *handlerConn) {
	h, conn := guardTx(tx, pool)
	return withTx(ctx, h, pool), conn
}
