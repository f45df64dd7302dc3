package pgevents_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/infrastructure/pgevents"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/internal/feedtest"
)

// TestMain fails the run if any goroutine outlives the tests.
func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

// migratedPostgres is a fresh test schema with the events table (the
// GORM event store's migrations run on it).
func migratedPostgres(t testing.TB) *dbtest.Postgres {
	t.Helper()
	pg := dbtest.NewPostgres(t)
	_, err := infrastructure.NewGormEventStore(pg.DB)
	require.NoError(t, err)
	return pg
}

// pgConnect opens one pgx connection, closed with the test.
func pgConnect(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(feedtest.Context(t), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// TestPostgresRefusalUnexplainedIsNoConflict: when the stored events
// cannot be read after the commit, a refused append may be the retry of
// one that committed; it is told the outcome is unknown, with the read's
// error in the chain, never a version conflict (which would have the
// caller run its command twice).
func TestPostgresRefusalUnexplainedIsNoConflict(t *testing.T) {
	ctx := feedtest.Context(t)
	pg := dbtest.NewPostgres(t)
	store, err := infrastructure.NewGormEventStore(pg.DB)
	require.NoError(t, err)
	defer func() { require.NoError(t, store.Close()) }()
	ev := feedtest.NewEvent("co-unknown", "x", nil)
	require.NoError(t, store.Append(ctx, "co-unknown", 0, ev))
	conn := pgConnect(t, pg.DSN)
	require.ErrorIs(t, pgevents.ExplainRefusal(ctx, conn, "co-unknown", 0, ev), domain.ErrAlreadyAppended, "read: explained")

	canceled, cancel := context.WithCancel(ctx)
	cancel()
	err = pgevents.ExplainRefusal(canceled, conn, "co-unknown", 0, ev)
	require.ErrorIs(t, err, context.Canceled, "the read's error is kept in the chain")
	require.NotErrorIs(t, err, domain.ErrConcurrencyConflict)
	require.NotErrorIs(t, err, domain.ErrAlreadyAppended)
	require.ErrorContains(t, err, "retry the same call")
	require.ErrorContains(t, err, "co-unknown")
}
