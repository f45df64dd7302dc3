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
// On SQLite it also watches for a statement that ended the transaction
// behind the batch's back (see watchTx).
//
// Handlers run on the batch's goroutine, but one may hand the transaction
// to another goroutine; the record is therefore guarded by a mutex.
type handlerConn struct {
	gorm.ConnPool // the batch transaction: *sql.Tx or *pinnedTx
	pool          *sql.DB
	watch         bool // SQLite: see watchTx

	mu     sync.Mutex
	misuse error
	// ended records the statement that ended the transaction (watch).
	ended error
	// unobserved: a query or prepared statement ran since the last
	// check; its errors surface in *sql.Rows or *sql.Stmt, past this type.
	unobserved bool
}

var (
	_ gorm.ConnPool       = (*handlerConn)(nil)
	_ gorm.TxCommitter    = (*handlerConn)(nil)
	_ gorm.GetDBConnector = (*handlerConn)(nil)
)

// guardTx returns the handler's view of the batch transaction tx, begun on
// pool. It keeps tx's statement context. watch is set for a SQLite batch
// (see watchTx).
func guardTx(tx *gorm.DB, pool *sql.DB, watch bool) (*gorm.DB, *handlerConn) {
	conn := &handlerConn{ConnPool: tx.Statement.ConnPool, pool: pool, watch: watch}
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

// handlerContext attaches the handler's view of tx to ctx, for the
// application's code that runs in a transaction of this package's own (a
// replay, a reset's statements); the returned handlerConn tells
// afterwards (finished) whether it tried to end tx or, with watch (SQLite),
// whether a statement ended it.
func handlerContext(ctx context.Context, tx *gorm.DB, pool *sql.DB, watch bool) (context.Context, *handlerConn) {
	h, conn := guardTx(tx, pool, watch)
	return withTx(ctx, h, pool), conn
}

// finished returns, once the application's code has returned, the error
// that keeps its transaction from committing: a Commit or Rollback it
// attempted (misused), or a statement that ended the transaction
// (afterHandler); nil when the transaction may go on.
func (c *handlerConn) finished(ctx context.Context) error {
	if err := c.misused(); err != nil {
		return err
	}
	return c.afterHandler(ctx)
}

// watchTx (SQLite): some statement failures make SQLite roll back the
// whole transaction, not just the statement — a trigger's RAISE(ROLLBACK),
// INSERT OR ROLLBACK, some SQLITE_FULL and SQLITE_IOERR cases — and leave
// the connection in autocommit. database/sql does not notice: a handler
// that swallowed the error, the handlers after it and the checkpoint UPDATE
// would each commit on their own, so events would be skipped or handled
// twice. So the batch asks SQLite whether its transaction still stands
// (txStands) after every failed statement; before the next statement after
// a query or prepared statement, whose errors surface past this type (in
// *sql.Rows, *sql.Row or *sql.Stmt), and after the handler (or batch
// handler) if it ended on one; and once before the checkpoint UPDATE (see
// gormBatch.Commit). When it is gone the *sql.Tx is ended at once, so that
// every later statement of the batch fails with sql.ErrTxDone instead of
// running in autocommit, and the handler's event takes the failure path
// (see handlerResult). A failed statement costs one question more, and so
// does a statement that follows a query; an Exec after an Exec costs
// nothing.
func (c *handlerConn) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	c.observe(ctx)
	res, err := c.ConnPool.ExecContext(ctx, query, args...)
	if err != nil && c.watch {
		c.checkTx(ctx)
	}
	return res, err
}

// QueryContext runs the query in the batch transaction (see ExecContext).
func (c *handlerConn) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	c.observe(ctx)
	c.markUnobserved()
	rows, err := c.ConnPool.QueryContext(ctx, query, args...)
	if err != nil && c.watch {
		c.checkTx(ctx)
	}
	return rows, err
}

// QueryRowContext runs the query in the batch transaction (see
// ExecContext).
func (c *handlerConn) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	c.observe(ctx)
	c.markUnobserved()
	return c.ConnPool.QueryRowContext(ctx, query, args...)
}

// PrepareContext prepares a statement in the batch transaction (see
// ExecContext).
func (c *handlerConn) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	c.observe(ctx)
	c.markUnobserved()
	stmt, err := c.ConnPool.PrepareContext(ctx, query)
	if err != nil && c.watch {
		c.checkTx(ctx)
	}
	return stmt, err
}

// observe asks whether the transaction stands before a statement that
// follows a query or prepared statement (see watchTx): a statement that
// ended it there must not be followed by one in autocommit.
func (c *handlerConn) observe(ctx context.Context) {
	if !c.watch {
		return
	}
	c.mu.Lock()
	unobserved := c.unobserved && c.ended == nil
	c.mu.Unlock()
	if unobserved {
		c.checkTx(ctx)
	}
}

func (c *handlerConn) markUnobserved() {
	if !c.watch {
		return
	}
	c.mu.Lock()
	c.unobserved = true
	c.mu.Unlock()
}

// checkTx asks SQLite whether the batch transaction still stands, unless a
// statement is already known to have ended it, and returns the error that
// records its end, or nil.
func (c *handlerConn) checkTx(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended != nil {
		return c.ended
	}
	c.unobserved = false
	if txStands(ctx, c.ConnPool) {
		return nil
	}
	c.ended = fmt.Errorf("subscriptions: %w (the batch's writes are discarded)", errTxEndedByStatement)
	return c.ended
}

// afterHandler returns the error that records a statement ending the batch
// transaction, checking first when the handler ran statements whose
// errors this type did not see; nil when the transaction stands.
func (c *handlerConn) afterHandler(ctx context.Context) error {
	if c == nil || !c.watch {
		return nil
	}
	c.mu.Lock()
	ended, unobserved := c.ended, c.unobserved
	c.mu.Unlock()
	if ended != nil || !unobserved {
		return ended
	}
	return c.checkTx(ctx)
}

// txStands reports whether the SQLite transaction behind tx (a *sql.Tx)
// is still open. BEGIN is the question: SQLite refuses it inside a
// transaction ("cannot start a transaction within a transaction") and
// nothing else changes; outside one it succeeds and opens a new
// transaction, which is then ended together with tx through tx's Rollback
// (database/sql then refuses every later statement of tx with
// sql.ErrTxDone, so none of them runs in autocommit). A BEGIN that fails
// for any other reason is taken as standing: the batch's own Commit asks
// again before the checkpoint UPDATE.
func txStands(ctx context.Context, tx gorm.ConnPool) bool {
	ctx = context.WithoutCancel(ctx)
	if _, err := tx.ExecContext(ctx, "BEGIN"); err != nil {
		return true
	}
	if committer, ok := tx.(gorm.TxCommitter); ok {
		_ = committer.Rollback() // ends the BEGIN just issued and tx with it
	}
	return false
}

// endedByStatement reports whether a statement was found to have ended
// the batch transaction (watchTx).
func (c *handlerConn) endedByStatement() bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ended != nil
}
