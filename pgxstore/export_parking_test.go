package pgxstore

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// WithBatchTx attaches tx, begun on pool, to ctx as a batch of this
// package's checkpoint store does, so that the parking lot's tests can run
// it inside a batch transaction of their own.
func WithBatchTx(ctx context.Context, tx pgx.Tx, pool *pgxpool.Pool) context.Context {
	return withTx(ctx, newHandlerTx(tx, pool))
}
