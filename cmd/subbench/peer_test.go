package main

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestTxCounter: scenario 13's idle figures count, at the driver, what
// the server counts as transactions: a statement outside BEGIN/COMMIT is
// one of its own, the statements inside one are not, and nothing is
// counted while the counter is off.
func TestTxCounter(t *testing.T) {
	dbtest.RequirePostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang, not a speed limit
	defer cancel()
	cfg, err := pgx.ParseConfig(dbtest.PostgresDSN())
	require.NoError(t, err)
	c := &txCounter{}
	cfg.Tracer = c
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(context.Background())

	_, err = conn.Exec(ctx, "SELECT 1")
	require.NoError(t, err)
	require.Zero(t, c.single.Load()+c.commits.Load(), "counted while off")

	c.on.Store(true)
	_, err = conn.Exec(ctx, "SELECT 1")
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SELECT 1")
		return err
	}))
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))

	require.Equal(t, int64(1), c.single.Load(), "single statements")
	require.Equal(t, int64(1), c.commits.Load(), "commits")
	require.Equal(t, int64(1), c.rollbacks.Load(), "rollbacks")
}
