package subscriptions

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// transient reports whether a failure to commit a batch says nothing
// about its events: the connection or the server failed, or the
// transaction lost a race it may win next time. Such a batch is retried
// whole after the poll interval, as often as it takes, and no event is
// blamed or parked for it (an outage must never park good events).
//
// Every other commit failure is the events' doing (a deferred constraint,
// a statement a handler let fail, a transaction a handler kept open past
// idle_in_transaction_session_timeout, a handler that tried to end the
// batch transaction): it takes the handler-failure path (see doc.go).
func transient(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return transientSQLState(pgErr.Code)
	}
	var netErr net.Error
	switch {
	case errors.Is(err, driver.ErrBadConn), errors.Is(err, sql.ErrConnDone),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.As(err, &netErr), pgconn.SafeToRetry(err), pgconn.Timeout(err):
		return true
	}
	// SQLite's SQLITE_BUSY and SQLITE_LOCKED, by their fixed messages (the
	// library does not import the cgo driver for its error type).
	msg := err.Error()
	return strings.Contains(msg, "database is locked") || strings.Contains(msg, "database table is locked")
}

// transientSQLState classifies a Postgres error code: connection
// exceptions (08), transaction rollbacks such as serialization failures
// and deadlocks (40), insufficient resources (53), operator intervention
// (57: shutdown, cancellation) and system errors (58) are transient.
// Integrity violations (23) and invalid transaction states (25: an aborted
// transaction, 25P03 the idle-in-transaction timeout) are not.
func transientSQLState(code string) bool {
	if len(code) < 2 {
		return false
	}
	switch code[:2] {
	case "08", "40", "53", "57", "58":
		return true
	}
	return false
}
