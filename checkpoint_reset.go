package subscriptions

import (
	"context"
	"errors"
	"fmt"
)

// CheckpointResetter is implemented by checkpoint stores that can move or
// delete a subscriber's checkpoint in one transaction with the
// application's own statements: the store behind
// Subscriber.ResetCheckpointWith and Subscriber.DeleteState.
// GormCheckpointStore and MemoryCheckpointStore implement it; the
// CheckpointStore interface itself is unchanged, so other stores keep
// working and those two calls report errors.ErrUnsupported for them.
//
// Both methods hold off every batch of the subscriber, in this process and
// (on Postgres) in every other, from before apply runs until the change is
// committed, and wait for the batch in flight to end first; so no batch can
// land between the application's cleanup and the checkpoint move. apply
// receives a context carrying the transaction (TxFromContext; nil for the
// memory store) and must write through it: on SQLite another connection
// would wait for the write lock this transaction holds. If apply (or the
// checkpoint write) fails, nothing is changed: the transaction rolls back
// and the error is returned; a panic in apply rolls back too, lifts the
// hold-off and propagates. A nil apply only moves the checkpoint.
// If ctx ends first (while waiting for the batch in flight, say), the
// error wraps ctx's error and nothing is changed. However it ends, when
// either method returns nothing of it holds a lock or the hold-off any
// more, so every replica's next Acquire is granted at once; on Postgres
// GormCheckpointStore cancels the statement running on the server when
// ctx ends and returns only after the transaction rolled back, since a
// client that merely stops waiting leaves the statement to take the row
// lock after it returned. Implementations are safe for concurrent use.
//
// What apply must not do, because the hold-off lasts until it returns:
//   - commit, roll back or keep the transaction (use it after returning);
//   - call ResetCheckpoint, ResetCheckpointWith or DeleteState (or the
//     store's Reset, ResetWith or Delete) for the same subscriber name:
//     they wait for this hold-off, which waits for apply, so the call
//     deadlocks until ctx ends (the memory store's plain Reset fails with
//     ErrBatchInFlight instead).
//
// Nor may either method be called from a handler of the same name: the
// handler's batch is the one in flight they wait for, so they deadlock
// until ctx ends.
type CheckpointResetter interface {
	CheckpointStore

	// ResetWith runs apply and sets the subscriber's checkpoint to position
	// (creating it if needed), atomically.
	ResetWith(ctx context.Context, subscriber string, position int64, apply func(ctx context.Context) error) error

	// Delete runs apply and deletes the subscriber's checkpoint,
	// atomically. A subscriber that runs again afterwards starts from 0.
	Delete(ctx context.Context, subscriber string, apply func(ctx context.Context) error) error
}

// stepError is an error of an apply function this package passes to a
// CheckpointResetter itself (DeleteState's purge of parked events): it
// names its step, so the store does not call it the application's
// statements.
type stepError struct {
	step string
	err  error
}

func (e *stepError) Error() string { return e.step + ": " + e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

// applyError is the context a CheckpointResetter adds to an error of
// apply.
func applyError(err error) error {
	var step *stepError
	if errors.As(err, &step) {
		return err
	}
	return fmt.Errorf("application's statements: %w", err)
}
