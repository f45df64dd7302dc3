package subscriptions

import (
	"context"
	"database/sql"
)

// SQLTx is the batch transaction for handlers written against
// database/sql, sqlc or any other plain SQL layer instead of GORM: the
// four methods of *sql.Tx that run statements, which is also exactly
// sqlc's generated DBTX interface (so queries := db.New(tx) works) and
// GORM's ConnPool. A *sql.Tx satisfies it.
//
// Statements run through it are the batch transaction's, with the same
// guarantee as writes through TxFromContext: they commit atomically with
// the checkpoint advance (exactly-once, see the package documentation),
// and a failed handler attempt's writes are discarded. SQL is passed to
// the driver as written, so use the driver's placeholders ($1 for pgx on
// Postgres; ? or $1 on SQLite).
//
// The handle is owned by the batch, like the transaction behind it: use it
// only on the handler's goroutine, only until the handler returns, and
// never COMMIT or ROLLBACK through it. Rows and statements it returns must
// be closed before the handler returns.
type SQLTx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

var _ SQLTx = (*sql.Tx)(nil)

// SQLTxFromContext returns the batch transaction attached to a handler's
// context as a database/sql handle (see SQLTx), or nil when the handler is
// not running inside a database-backed batch (MemoryCheckpointStore). It
// is the same transaction TxFromContext returns, whichever way the batch
// began it: on Postgres the wake-up path begins it on a pinned connection
// in one round trip with the feed read, so it is not always a *sql.Tx, but
// it always behaves as one. GormParkingLot's Replay attaches its
// transaction the same way.
func SQLTxFromContext(ctx context.Context) SQLTx {
	tx := TxFromContext(ctx)
	if tx == nil || tx.Statement == nil || tx.Statement.ConnPool == nil {
		return nil
	}
	return tx.Statement.ConnPool
}
