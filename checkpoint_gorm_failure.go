package subscriptions

import (
	"database/sql"
	"errors"
	"fmt"

	"github.com/eventfeed/subscriptions/internal/sqlerr"
)

// errTxRolledBack is a COMMIT that the database turned into a rollback
// because the transaction had failed (a statement in it failed).
var errTxRolledBack = errors.New("the transaction had failed and was rolled back")

// errTxEndedByStatement is a SQLite batch transaction that a handler's
// statement rolled back as a whole although the batch never ended it (see
// handlerConn.watchTx).
var errTxEndedByStatement = fmt.Errorf("a statement rolled back the whole SQLite transaction: %w", ErrBatchTxEnded)

var _ FailureClassifier = (*GormCheckpointStore)(nil)

// CommitFailedByEvents classifies the failure of a batch's COMMIT (see
// FailureClassifier): a constraint checked at commit (a deferred foreign
// key; SQLite's SQLITE_CONSTRAINT by result code), bad data, an error
// raised by a trigger, an invalid transaction state, a transaction the
// database rolled back because it had failed, or a COMMIT on a
// transaction a handler ended are the events' doing; text never decides.
func (g *GormCheckpointStore) CommitFailedByEvents(err error) bool {
	if errors.Is(err, sql.ErrTxDone) || errors.Is(err, errTxRolledBack) || sqlerr.CommitRolledBack(err) {
		return true
	}
	if code := sqlerr.SQLState(err); code != "" {
		return eventCausedSQLState(code)
	}
	return sqlerr.SQLiteConstraintViolation(err)
}

// TxLeftFailed reports whether err says that the transaction was already
// unusable when the statement that returned it ran (see
// FailureClassifier): rolled back, aborted by an earlier statement
// (Postgres 25P02), or idle past idle_in_transaction_session_timeout
// (25P03).
func (g *GormCheckpointStore) TxLeftFailed(err error) bool {
	if errors.Is(err, errTxRolledBack) || sqlerr.CommitRolledBack(err) {
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
