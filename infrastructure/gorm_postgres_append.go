package infrastructure

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/eventfeed/subscriptions/internal/pgxconn"
)

// errNotPgx reports that the pool's driver connection is not pgx (a
// *gorm.DB opened on another Postgres driver), so the append falls back
// to the portable path.
var errNotPgx = errors.New("connection is not a pgx connection")

// withPgxConn is the store's pgevents.ConnFunc: the pipelined append
// (s.appender, the engine pgxstore runs too) runs on the pgx connection
// under a connection of the *gorm.DB's database/sql pool. It fails with
// errNotPgx, before f runs, when the driver is not pgx. The connection is
// handed back outside any transaction, or dropped (driver.ErrBadConn);
// once f ran, its outcomes stand whatever that says.
func (s *GormEventStore) withPgxConn(ctx context.Context, f func(*pgx.Conn)) error {
	conn, err := s.pool.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	ran := false
	err = conn.Raw(func(dc any) error {
		pc, ok := pgxconn.Unwrap(dc)
		if !ok {
			return errNotPgx
		}
		ran = true
		f(pc)
		// Never hand a connection back to the pool inside a transaction.
		return pgxconn.EndSession(ctx, pc, nil)
	})
	if ran || errors.Is(err, errNotPgx) {
		return err
	}
	if err == nil || errors.Is(err, driver.ErrBadConn) {
		err = fmt.Errorf("no outcome from the append transaction: %w", err)
	}
	return err
}
