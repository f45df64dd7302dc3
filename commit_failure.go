package subscriptions

import (
	"database/sql"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// errTxRolledBack is a COMMIT that the database turned into a rollback
// because the transaction had failed (a statement in it failed).
var errTxRolledBack = errors.New("the transaction had failed and was rolled back")

// eventCaused reports whether a failure to commit a batch was caused by
// what its handlers did, so that it takes the handler-failure path (the
// events run one per transaction to find the culprit, which is retried
// and parked; see doc.go):
//
//   - a constraint checked at commit (a deferred foreign key, SQLite's
//     "constraint failed"), bad data, or an error raised by a trigger;
//   - a transaction a handler left failed (Postgres "current transaction is
//     aborted", a COMMIT turned into a rollback) or kept open past
//     idle_in_transaction_session_timeout (SQLSTATE class 25);
//   - a handler that tried to end the batch transaction (sql.ErrTxDone).
//
// Anything else — a lost connection, a server shutting down, a
// serialization failure, an error nobody recognises — says nothing about
// the events: the batch is retried whole after the poll interval, as often
// as it takes, and no event is blamed or parked for it (an outage must
// never park good events).
func eventCaused(err error) bool {
	if errors.Is(err, sql.ErrTxDone) || errors.Is(err, errTxRolledBack) || errors.Is(err, pgx.ErrTxCommitRollback) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return eventCausedSQLState(pgErr.Code)
	}
	return err != nil && strings.Contains(err.Error(), "constraint failed") // SQLITE_CONSTRAINT
}

// eventCausedSQLState classifies a Postgres error code: data exceptions
// (22), integrity violations (23), invalid transaction states (25),
// triggered data change violations (27), syntax or access errors such as
// an undefined table (42), and errors raised in PL/pgSQL (P0).
// Connection exceptions (08), transaction rollbacks such as deadlocks
// (40), insufficient resources (53), operator intervention (57) and system
// errors (58, XX) are not the events' doing.
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
