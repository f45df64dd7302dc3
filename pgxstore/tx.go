package pgxstore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrTxOwnedByBatch is wrapped by the error Commit and Rollback return on
// the transaction TxFromContext hands a handler: the batch commits it
// together with the checkpoint, and a handler that ended it would commit
// its writes without the checkpoint (they would be applied again) or drop
// the writes of the events before it. Nothing is ended, and the attempt
// fails as a whole whatever the handler does with the error.
var ErrTxOwnedByBatch = errors.New("pgxstore: the batch transaction is committed or rolled back by its batch, not by a handler")

// txKey is the context key of the handler's transaction.
type txKey struct{}

// TxFromContext returns the batch transaction attached to a handler's
// context by a batch of this package's CheckpointStore (or a replay or
// reset of its parking lot and store), or nil outside one. Writes through
// it commit atomically with the checkpoint advance. Its Commit and
// Rollback return an error wrapping ErrTxOwnedByBatch; Begin starts a
// savepoint, as pgx's nested transactions do. Its CopyFrom is Postgres's
// COPY in the batch transaction: a batch handler
// (subscriptions.WithBatchHandler) that rebuilds a projection writes its
// rows at COPY's speed, and they commit with the checkpoint, or roll back
// with it, like any of its writes.
//
// The transaction belongs to the batch's goroutine, as a pgx.Tx belongs
// to one goroutine: a handler must not use it after it returns, nor from
// two goroutines at once.
func TxFromContext(ctx context.Context) pgx.Tx {
	if t, ok := ctx.Value(txKey{}).(*handlerTx); ok {
		return t
	}
	return nil
}

// withTx attaches tx to ctx for handlers.
func withTx(ctx context.Context, tx *handlerTx) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// handlerTx is the handler's view of a batch transaction: statements go
// through, Commit and Rollback are refused and recorded.
type handlerTx struct {
	pgx.Tx
	pool *pgxpool.Pool // the pool the transaction was begun on

	mu     sync.Mutex
	misuse error
}

var _ pgx.Tx = (*handlerTx)(nil)

func newHandlerTx(tx pgx.Tx, pool *pgxpool.Pool) *handlerTx { return &handlerTx{Tx: tx, pool: pool} }

// txForPool returns the context's batch transaction (the handler's view)
// only when it was begun on pool: a parking lot on another database must
// not write through it.
func txForPool(ctx context.Context, pool *pgxpool.Pool) *handlerTx {
	if t, ok := ctx.Value(txKey{}).(*handlerTx); ok && t.pool == pool && pool != nil {
		return t
	}
	return nil
}

// Commit refuses to commit the batch transaction from a handler.
func (h *handlerTx) Commit(context.Context) error { return h.refuse("Commit") }

// Rollback refuses to roll the batch transaction back from a handler.
func (h *handlerTx) Rollback(context.Context) error { return h.refuse("Rollback") }

func (h *handlerTx) refuse(op string) error {
	err := fmt.Errorf("%s by a handler: %w", op, ErrTxOwnedByBatch)
	h.mu.Lock()
	if h.misuse == nil {
		h.misuse = err
	}
	h.mu.Unlock()
	return err
}

// misused returns the first refused Commit or Rollback, if any.
func (h *handlerTx) misused() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.misuse
}

// forget drops the recorded misuse: it went with the attempt a
// savepoint rolled back.
func (h *handlerTx) forget() {
	h.mu.Lock()
	h.misuse = nil
	h.mu.Unlock()
}

// ended reports whether the transaction is over on the server: a
// handler's COMMIT, ROLLBACK or END sent as a statement ends it behind
// the batch's back, and the connection then reports idle.
func ended(conn *pgconn.PgConn) bool {
	return conn.TxStatus() == 'I'
}
