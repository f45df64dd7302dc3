package pgxstore

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eventfeed/subscriptions"
)

// batch is one transaction of a CheckpointStore, on one connection of the
// pool, which it holds from Acquire to Commit or Rollback and never needs
// a second. It belongs to the goroutine that acquired it.
type batch struct {
	store      *CheckpointStore
	subscriber string
	conn       *pgxpool.Conn
	tx         pgx.Tx
	position   int64
	marks      subscriptions.DeliveryMarks // read with the row's lock
	// attempt is the attempt record AcquireAfter read with the lock, for
	// the batch's first HasAttempt.
	attempt  prefetchedAttempt
	htx      *handlerTx // the handlers' view of tx, made by the first HandlerContext
	finished bool
	// claim is the holder of the attempt claim the batch committed (see
	// checkpoint_attempts.go), released by its Commit and Rollback; ""
	// when it wrote none.
	claim string
}

var (
	_ subscriptions.Batch        = (*batch)(nil)
	_ subscriptions.TxEndChecker = (*batch)(nil)
)

func (b *batch) Position() int64 { return b.position }

// HandlerContext attaches the batch transaction for TxFromContext, guarded
// so that a handler cannot end it.
func (b *batch) HandlerContext(ctx context.Context) context.Context {
	if b.htx == nil {
		b.attempt = prefetchedAttempt{} // handlers may write anything
		b.htx = newHandlerTx(b.tx, b.store.pool)
	}
	return withTx(ctx, b.htx)
}

// HandlerEndedTx implements subscriptions.TxEndChecker: a handler that
// tried to end the transaction (refused, see ErrTxOwnedByBatch), or whose
// statement (COMMIT, ROLLBACK, END) ended it on the server, fails its
// event; nothing of the batch runs outside the transaction.
func (b *batch) HandlerEndedTx(context.Context) error {
	if b.htx == nil {
		return nil
	}
	if err := b.htx.misused(); err != nil {
		return fmt.Errorf("pgxstore: batch of %q: %w: %w", b.subscriber, subscriptions.ErrBatchTxEnded, err)
	}
	if ended(b.conn.Conn().PgConn()) {
		return fmt.Errorf("pgxstore: batch of %q: a handler's statement ended the transaction: %w", b.subscriber, subscriptions.ErrBatchTxEnded)
	}
	return nil
}

// Commit advances the checkpoint with a compare-and-set on the batch's
// start, refused while the name is paused, and commits the transaction.
func (b *batch) Commit(ctx context.Context, position int64) error {
	if b.finished {
		return fmt.Errorf("pgxstore: commit checkpoint of %q: %w", b.subscriber, subscriptions.ErrBatchFinished)
	}
	b.finished = true
	fail := func(err error) error {
		endTx(b.tx, b.conn)
		return fmt.Errorf("pgxstore: commit checkpoint of %q at position %d: %w", b.subscriber, position, err)
	}
	if b.tx == nil { // a renew failed: nothing to commit
		b.conn.Release()
		return fmt.Errorf("pgxstore: commit checkpoint of %q at position %d: %w", b.subscriber, position, subscriptions.ErrCheckpointMoved)
	}
	if position < b.position {
		return fail(fmt.Errorf("position is behind the batch's start %d", b.position))
	}
	if err := b.HandlerEndedTx(ctx); err != nil {
		return fail(err)
	}
	update, args := b.store.stmt.commitRow, []any{position, time.Now().UTC(), b.subscriber, b.position, subscriptions.PauseKey(b.subscriber)}
	if b.claim != "" {
		// The batch's attempt claim goes in the same statement: once the
		// commit lands, its record is a plain record of the position it
		// committed.
		update = b.store.stmt.commitReleasing
		args = append(args, b.claim)
	}
	tag, err := b.tx.Exec(ctx, update, args...)
	if err != nil {
		return fail(err)
	}
	if tag.RowsAffected() != 1 {
		return fail(subscriptions.ErrCheckpointMoved) // reset, or paused meanwhile
	}
	err = b.tx.Commit(ctx)
	if err != nil {
		// A failed COMMIT leaves no transaction; a connection that could
		// not even say so is closed by pgx.
		b.conn.Release()
		return fmt.Errorf("pgxstore: commit checkpoint of %q at position %d: %w", b.subscriber, position, err)
	}
	b.conn.Release()
	return nil
}

// Rollback abandons the batch; the checkpoint stays.
func (b *batch) Rollback() error {
	if b.finished {
		return fmt.Errorf("pgxstore: roll back batch of %q: %w", b.subscriber, subscriptions.ErrBatchFinished)
	}
	b.finished = true
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	defer b.conn.Release()
	if b.tx != nil {
		err := b.tx.Rollback(ctx)
		if err != nil && !errors.Is(err, pgx.ErrTxClosed) && !ended(b.conn.Conn().PgConn()) {
			_ = b.conn.Conn().Close(ctx)
			return fmt.Errorf("pgxstore: roll back batch of %q: %w", b.subscriber, err)
		}
	}
	if b.claim != "" {
		return b.releaseClaim(ctx)
	}
	return nil
}

// savepointName restricts savepoint names to plain identifiers: the name
// goes into the statement's text.
var savepointName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

func (b *batch) Savepoint(ctx context.Context, name string) error {
	if !savepointName.MatchString(name) {
		return fmt.Errorf("pgxstore: savepoint name %q is not a plain identifier", name)
	}
	if _, err := b.tx.Exec(ctx, "SAVEPOINT "+name); err != nil {
		return fmt.Errorf("pgxstore: savepoint %s in batch of %q: %w", name, b.subscriber, err)
	}
	return nil
}

func (b *batch) RollbackToSavepoint(ctx context.Context, name string) error {
	if !savepointName.MatchString(name) {
		return fmt.Errorf("pgxstore: savepoint name %q is not a plain identifier", name)
	}
	if _, err := b.tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+name); err != nil {
		return fmt.Errorf("pgxstore: roll back to savepoint %s in batch of %q: %w", name, b.subscriber, err)
	}
	// A Commit or Rollback a handler attempted after the savepoint went
	// with the attempt it belonged to.
	if b.htx != nil {
		b.htx.forget()
	}
	return nil
}

var _ subscriptions.FailureClassifier = (*CheckpointStore)(nil)

// CommitFailedByEvents classifies the failure of a batch's COMMIT (see
// subscriptions.FailureClassifier): a constraint checked at commit, bad
// data, an error raised by a trigger, an invalid transaction state, or a
// transaction Postgres rolled back because it had failed are the events'
// doing; a lost connection, a deadlock, a server shutting down are not.
func (s *CheckpointStore) CommitFailedByEvents(err error) bool {
	if errors.Is(err, pgx.ErrTxCommitRollback) || errors.Is(err, subscriptions.ErrBatchTxEnded) {
		return true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) < 2 {
		return false
	}
	// Data exceptions (22), integrity violations (23), invalid
	// transaction states (25), triggered data change violations (27),
	// syntax or access errors such as a table a deferred trigger lacks
	// (42), PL/pgSQL's RAISE (P0). Not: connection exceptions (08),
	// transaction rollbacks such as deadlocks (40), insufficient
	// resources (53), operator intervention (57), system errors (58, XX).
	switch pgErr.Code[:2] {
	case "22", "23", "25", "27", "42", "P0":
		return true
	}
	return false
}

// TxLeftFailed reports whether err says that the transaction was already
// unusable when the statement that returned it ran: aborted by an earlier
// statement (25P02), idle past idle_in_transaction_session_timeout
// (25P03), or rolled back at COMMIT.
func (s *CheckpointStore) TxLeftFailed(err error) bool {
	if errors.Is(err, pgx.ErrTxCommitRollback) {
		return true
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "25P02" || pgErr.Code == "25P03")
}
