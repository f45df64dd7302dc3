package subscriptions

import (
	"context"
	"errors"
)

// ErrBatchTxEnded marks a batch whose transaction a handler's statement
// ended behind the batch's back (on SQLite a statement that rolls back the
// whole transaction: a trigger's RAISE(ROLLBACK), INSERT OR ROLLBACK, some
// disk-full or I/O errors). The handler's event is then the culprit, even
// if the handler swallowed the statement's error, and nothing of the batch
// runs any more (see the package documentation, Failures).
var ErrBatchTxEnded = errors.New("a statement ended the batch transaction")

// commitStage is where in a batch's commit a failure came from, which is
// what decides whether an event is to blame (see eventCaused).
type commitStage int

const (
	// stageCommit: the COMMIT itself, or a Commit of a CheckpointStore
	// that does not say (an untagged error).
	stageCommit commitStage = iota
	// stageHandlers: the handlers left the transaction unusable (a
	// Commit or Rollback they attempted, a statement that ended it).
	stageHandlers
	// stageLibrary: this package's own statements in the batch (the
	// removal of delivered parked entries, the checkpoint UPDATE, the
	// attempt record's removal).
	stageLibrary
)

// stagedError tags a commit failure with its stage.
type stagedError struct {
	stage commitStage
	err   error
}

func (e *stagedError) Error() string { return e.err.Error() }
func (e *stagedError) Unwrap() error { return e.err }

// staged tags err (nil stays nil).
func staged(stage commitStage, err error) error {
	if err == nil {
		return nil
	}
	return &stagedError{stage: stage, err: err}
}

// FailureClassifier is the optional capability of a CheckpointStore that
// tells which failures of its batches were caused by what the handlers
// did: GormCheckpointStore knows its databases' error codes. The run loop
// sends such a failure down the handler-failure path (the batch's events
// run one per transaction to find the culprit, which is retried and
// parked; see the package documentation, Failures); any other failure (a
// lost connection, a server restart, a serialization failure) is retried
// as it is, batch and all, and blames no event. Without it, only what the
// loop itself sees is blamed on the events: a handler that tried to end
// the batch transaction, or one a statement ended (ErrBatchTxEnded).
type FailureClassifier interface {
	// CommitFailedByEvents reports whether err, the failure of a batch's
	// COMMIT, was the events' doing: a constraint checked at commit, bad
	// data, an error raised by a trigger, a transaction the database
	// rolled back because a statement in it had failed.
	CommitFailedByEvents(err error) bool
	// TxLeftFailed reports whether err, the failure of a statement in the
	// batch (this package's own, or a handler's), says only that the
	// transaction was already unusable when it ran, through an earlier
	// statement: on Postgres "current transaction is aborted" or an idle
	// timeout. A handler's such error blames an earlier handler that
	// swallowed its failure; a library statement's blames the handlers.
	TxLeftFailed(err error) bool
}

// eventCaused reports whether a failure to commit a batch was caused by
// what its handlers did (see FailureClassifier). Where the error came from
// decides first: the handlers' stage always is; this package's own
// statements are only when the handlers left the transaction failed; the
// COMMIT is when the store says so. Anything else says nothing about the
// events: the batch is retried whole after the poll interval, as often as
// it takes, and no event is blamed or parked for it (an outage must never
// park good events).
func (s *Subscriber) eventCaused(err error) bool {
	if err == nil {
		return false
	}
	stage := stageCommit
	var st *stagedError
	if errors.As(err, &st) {
		stage = st.stage
	}
	switch {
	case stage == stageHandlers || errors.Is(err, ErrBatchTxEnded):
		return true
	case s.classifier == nil:
		return false
	case stage == stageLibrary:
		return s.classifier.TxLeftFailed(err)
	}
	return s.classifier.CommitFailedByEvents(err)
}

// failedEarlier reports whether a handler's error says only that the
// batch transaction had already failed through an earlier statement: the
// culprit may be an earlier event's handler that swallowed its error, so
// the batch's events are run one per transaction to find it instead of
// blaming this one.
func (s *Subscriber) failedEarlier(err error) bool {
	return s.classifier != nil && s.classifier.TxLeftFailed(err)
}

// TxEndChecker is the optional capability of a Batch whose transaction a
// handler's statement can end behind the batch's back (SQLite: see
// ErrBatchTxEnded). After every handler call the run loop asks it, so that
// a statement that ended the transaction fails the handler's event even if
// the handler swallowed its error, and nothing later runs outside the
// transaction. Without it, no statement is assumed to end a transaction.
type TxEndChecker interface {
	// HandlerEndedTx returns an error wrapping ErrBatchTxEnded once a
	// statement of the handler that just returned (or of one before it)
	// ended the batch transaction, nil while it stands.
	HandlerEndedTx(ctx context.Context) error
}

// handlerResult returns the outcome of the handler that just ran in batch:
// err, or when it returned nil but one of its statements ended the batch
// transaction, the error that records it (TxEndChecker). The event is then
// the culprit, like one whose handler failed: the transaction is already
// gone, and no statement runs on it any more.
func handlerResult(ctx context.Context, batch Batch, err error) error {
	c, ok := batch.(TxEndChecker)
	if !ok {
		return err
	}
	if lost := c.HandlerEndedTx(ctx); lost != nil {
		if err == nil {
			return lost
		}
		return errors.Join(err, lost)
	}
	return err
}

// ResetAborter is the optional capability of a Batch that a reset can end
// under its owner (on SQLite the reset rolls the batch back itself, so that
// it never waits for the batch's owner). The run loop asks it when a
// handler fails: a failure the reset caused is no failure of the event,
// and the batch is discarded as on ErrCheckpointMoved. Without it, a
// batch's failures are its events' or its store's.
type ResetAborter interface {
	// AbortedByReset reports whether a reset ended the batch.
	AbortedByReset() bool
}

// resetAborted reports whether batch was ended by a reset (ResetAborter).
func resetAborted(batch Batch) bool {
	a, ok := batch.(ResetAborter)
	return ok && a.AbortedByReset()
}
