package subscriptions

import (
	"context"
	"errors"
	"fmt"

	"github.com/eventfeed/subscriptions/internal/ident"
)

// Batch is one acquired processing cycle for a subscriber. Exactly one of
// Commit or Rollback must be called.
//
// A Batch belongs to the goroutine that acquired it and is not safe for
// concurrent use: database-backed batches wrap one transaction, and a
// transaction's connection must not be used from two goroutines at once.
type Batch interface {
	// Position is the committed checkpoint at acquisition time; the cycle
	// processes events after it.
	Position() int64

	// HandlerContext derives the context handlers run with. Database-backed
	// implementations attach the batch transaction so handlers can join it
	// via TxFromContext.
	HandlerContext(ctx context.Context) context.Context

	// Commit advances the checkpoint to position and commits the batch
	// (including any handler writes made through the batch transaction).
	Commit(ctx context.Context, position int64) error

	// Rollback abandons the cycle: the checkpoint stays at Position() and
	// any handler writes made through the batch transaction are discarded.
	Rollback() error

	// Savepoint marks a rollback point inside the batch and
	// RollbackToSavepoint discards everything written through the batch
	// transaction after the mark. The subscriber brackets each handler
	// attempt with one so a failed attempt's partial writes are discarded
	// without abandoning the whole batch. Implementations without a
	// transaction treat both as no-ops.
	Savepoint(ctx context.Context, name string) error
	RollbackToSavepoint(ctx context.Context, name string) error
}

// CheckpointStore persists the position each named subscriber has
// processed up to. Implementations coordinate concurrent access: at most
// one Batch per subscriber name is active at a time.
type CheckpointStore interface {
	// Acquire begins a processing cycle for the named subscriber, creating
	// the checkpoint at position 0 if it does not exist. It returns
	// acquired=false (and no Batch) when another process currently holds the
	// subscriber's checkpoint; the caller should skip the cycle.
	Acquire(ctx context.Context, subscriber string) (batch Batch, acquired bool, err error)

	// Position returns the subscriber's committed checkpoint (0 if the
	// subscriber is unknown).
	Position(ctx context.Context, subscriber string) (int64, error)

	// Reset sets the subscriber's committed checkpoint, creating it if
	// needed. Resetting to 0 makes the subscriber replay all history,
	// incrementally and resumably, on its next cycles. Implementations
	// serialize Reset against in-flight batches: either Reset waits for the
	// batch (or fails), or the batch's Commit detects the moved checkpoint
	// and aborts — a reset is never silently overwritten.
	Reset(ctx context.Context, subscriber string, position int64) error
}

var (
	// ErrCheckpointMoved is returned by a batch's Commit when the
	// subscriber's checkpoint was changed (by a Reset) after the batch was
	// acquired. The batch is rolled back and the reset stands.
	ErrCheckpointMoved = errors.New("checkpoint moved while the batch was in flight")

	// ErrBatchInFlight is returned by MemoryCheckpointStore.Reset while a
	// batch for the subscriber is active, or a ResetWith or Delete of it
	// runs.
	ErrBatchInFlight = errors.New("a batch is in flight for the subscriber")

	// ErrBatchFinished is returned when Commit or Rollback is called on a
	// batch that has already been committed or rolled back.
	ErrBatchFinished = errors.New("batch already finished")
)

// MaxSubscriberNameBytes bounds subscriber names. Longer names are
// rejected rather than truncated (Postgres keeps names in a B-tree index
// whose entries are limited in size).
const MaxSubscriberNameBytes = ident.MaxBytes

// CheckSubscriberName rejects a subscriber name that a checkpoint store
// could not keep exactly: empty, longer than MaxSubscriberNameBytes, not
// valid UTF-8, or containing a NUL character. This package's stores apply
// it to every name they are given; a store of one's own (see the package
// documentation, Other backends) applies it too, so that every backend
// takes the same names.
func CheckSubscriberName(name string) error {
	return ident.Check("subscriber name", name)
}

// validateName is CheckSubscriberName.
func validateName(name string) error { return CheckSubscriberName(name) }

func validatePosition(subscriber string, position int64) error {
	if position < 0 {
		return fmt.Errorf("subscriptions: subscriber %q: position %d is negative", subscriber, position)
	}
	return nil
}
