package subscriptions

import (
	"context"
	"database/sql"
	"errors"

	"github.com/eventfeed/subscriptions/internal/sqlerr"
)

// errTxRolledBack is a COMMIT that the database turned into a rollback
// because the transaction had failed (a statement in it failed).
var errTxRolledBack = errors.New("the transaction had failed and was rolled back")

// errTxEndedByStatement is a SQLite batch transaction that a handler's
// statement rolled back as a whole (a trigger's RAISE(ROLLBACK), INSERT OR
// ROLLBACK, some SQLITE_FULL or SQLITE_IOERR cases) although the batch
// never ended it. See handlerConn.watchTx.
var errTxEndedByStatement = errors.New("a statement rolled back the whole SQLite transaction")

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
	// removal of delivered parked entries, the checkpoint UPDATE).
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

// eventCaused reports whether a failure to commit a batch was caused by
// what its handlers did, so that it takes the handler-failure path (the
// events run one per transaction to find the culprit, which is retried
// and parked; see doc.go). Where the error came from decides first:
//
//   - stageHandlers: always the events' doing;
//   - stageLibrary (this package's statements): only when the handlers
//     had left the transaction failed (Postgres "current transaction is
//     aborted", 25P02), idle past idle_in_transaction_session_timeout
//     (25P03) or rolled back (a COMMIT turned into a rollback). A missing
//     table, a permission, a read-only server or bad data in the
//     library's own statement blames no event;
//   - stageCommit (the COMMIT): a constraint checked at commit (a deferred
//     foreign key; SQLite's SQLITE_CONSTRAINT by result code), bad data, an
//     error raised by a trigger, an invalid transaction state, or a
//     transaction the database rolled back because it had failed.
//
// Anything else — a lost connection, a server shutting down, a
// serialization failure, an error nobody recognises — says nothing about
// the events: the batch is retried whole after the poll interval, as often
// as it takes, and no event is blamed or parked for it (an outage must
// never park good events).
func eventCaused(err error) bool {
	if err == nil {
		return false
	}
	stage := stageCommit
	var st *stagedError
	if errors.As(err, &st) {
		stage = st.stage
	}
	switch stage {
	case stageHandlers:
		return true
	case stageLibrary:
		return txLeftFailed(err)
	}
	if errors.Is(err, sql.ErrTxDone) || errors.Is(err, errTxRolledBack) || errors.Is(err, errTxEndedByStatement) || sqlerr.CommitRolledBack(err) {
		return true
	}
	if code := sqlerr.SQLState(err); code != "" {
		return eventCausedSQLState(code)
	}
	return sqlerr.SQLiteConstraintViolation(err)
}

// txLeftFailed reports whether err says that the transaction was already
// unusable when the statement that returned it ran: it failed through an
// earlier statement, not through its own.
func txLeftFailed(err error) bool {
	if errors.Is(err, errTxRolledBack) || errors.Is(err, errTxEndedByStatement) || sqlerr.CommitRolledBack(err) {
		return true
	}
	switch sqlerr.SQLState(err) {
	case "25P02", // in_failed_sql_transaction: current transaction is aborted
		"25P03": // idle_in_transaction_session_timeout
		return true
	}
	return false
}

// eventCausedSQLState classifies the Postgres error code of a failed
// COMMIT: data exceptions (22), integrity violations (23), invalid
// transaction states (25), triggered data change violations (27), syntax
// or access errors such as an undefined table in a deferred trigger (42),
// and errors raised in PL/pgSQL (P0). Connection exceptions (08),
// transaction rollbacks such as deadlocks (40), insufficient resources
// (53), operator intervention (57) and system errors (58, XX) are not the
// events' doing.
func eventCausedSQLState(code string) bool {
	if len(code) < 2 {
		return false
	}
	switch code[:2] {
	case "22", "23", "25", "27", "42", "P0":
		return true
	}
	return false
}

// handlerTxChecker is implemented by batches whose transaction a
// handler's statement can end behind the batch's back (SQLite, see
// handlerConn.watchTx).
type handlerTxChecker interface {
	// handlerEndedTx returns a non-nil error wrapping
	// errTxEndedByStatement once a statement of the handler that just
	// returned (or of one before it) ended the batch transaction.
	handlerEndedTx(ctx context.Context) error
}

// handlerResult returns the outcome of the handler that just ran in batch:
// err, or when it returned nil but one of its statements ended the batch
// transaction (SQLite), the error that records it. The event is then the
// culprit, like one whose handler failed: the transaction is already
// gone, and no statement runs on it any more.
func handlerResult(ctx context.Context, batch Batch, err error) error {
	c, ok := batch.(handlerTxChecker)
	if !ok {
		return err
	}
	if lost := c.handlerEndedTx(ctx); lost != nil {
		if err == nil {
			return lost
		}
		return errors.Join(err, lost)
	}
	return err
}

// failedEarlier reports whether a handler's error says only that the
// batch transaction had already failed through an earlier statement
// (Postgres 25P02): the culprit may be an earlier event's handler that
// swallowed its error, so the batch's events are run one per transaction
// to find it instead of blaming this one.
func failedEarlier(err error) bool {
	return sqlerr.SQLState(err) == "25P02"
}
