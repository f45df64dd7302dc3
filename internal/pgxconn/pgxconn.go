// Package pgxconn holds what the module's pipelined Postgres paths share:
// reaching the pgx connection under a database/sql connection, and
// handing that connection back to the pool outside any transaction.
package pgxconn

import (
	"context"
	"database/sql/driver"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// Unwrap returns the pgx connection of a database/sql driver connection
// (the argument of sql.Conn.Raw), or false when the pool is not pgx's.
func Unwrap(driverConn any) (*pgx.Conn, bool) {
	c, ok := driverConn.(interface{ Conn() *pgx.Conn })
	if !ok {
		return nil, false
	}
	return c.Conn(), true
}

// EndSession rolls back whatever transaction the session still has open,
// so the connection goes back to the pool clean. A connection that cannot
// be rolled back is closed and the result carries driver.ErrBadConn, which
// makes database/sql drop it. cause, if any, is kept in the result.
// The rollback runs even when ctx is cancelled, with its own deadline.
func EndSession(ctx context.Context, pc *pgx.Conn, cause error) error {
	if pc.PgConn().TxStatus() == 'I' {
		return cause
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := pc.Exec(rctx, "ROLLBACK"); err != nil {
		_ = pc.Close(rctx)
		if cause == nil {
			cause = err
		}
		return errors.Join(cause, driver.ErrBadConn)
	}
	return cause
}
