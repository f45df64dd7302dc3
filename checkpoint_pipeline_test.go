package subscriptions_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestPipelinedAcquire covers the one-round-trip acquisition that wake-ups
// and catch-up use on Postgres: it reads the feed inside the batch's own
// transaction, commits, rolls back and takes savepoints like an ordinary
// batch, always gives its pinned connection back to the pool, and steps
// aside (ordinary path) when the checkpoint is held or not created yet.
func TestPipelinedAcquire(t *testing.T) {
	t.Parallel()
	pg := dbtest.NewPostgres(t)
	e := gormEnv(t, "postgres", pg.DB, pg)
	cps := e.Checkpoints.(*subscriptions.GormCheckpointStore)
	require.True(t, subscriptions.PipelinesForTest(cps, e.Events))
	require.False(t, subscriptions.PipelinesForTest(cps, infrastructure.NewMemoryStore()))
	other, err := infrastructure.NewGormEventStore(pg.Open(t))
	require.NoError(t, err)
	require.False(t, subscriptions.PipelinesForTest(cps, other), "another pool: the feed cannot be read in the batch's connection")

	ctx := context.Background()
	ids := appendN(t, e.Events, "core.pipeline", 0, 5)
	createProjection(t, pg.DB, "core_pipeline_proj")
	const name = "core-pipeline"

	_, _, err = subscriptions.AcquireAndReadForTest(ctx, cps, name, 0, 10)
	require.True(t, subscriptions.IsNoPipeline(err), "no checkpoint row yet: the ordinary path creates it, got %v", err)
	require.Zero(t, coreInUse(t, pg.DB))
	require.NoError(t, cps.Reset(ctx, name, 0))

	// Rollback discards the handler's writes and keeps the checkpoint.
	batch, events, err := subscriptions.AcquireAndReadForTest(ctx, cps, name, 0, 3)
	require.NoError(t, err)
	require.Equal(t, ids[:3], coreIDs(events))
	require.Equal(t, int64(0), batch.Position())
	hctx := batch.HandlerContext(ctx)
	require.NoError(t, project(hctx, "core_pipeline_proj", events[0]))
	require.NoError(t, batch.Rollback())
	require.ErrorIs(t, batch.Rollback(), subscriptions.ErrBatchFinished)
	require.Empty(t, projected(t, pg.DB, "core_pipeline_proj"))
	require.Zero(t, coreInUse(t, pg.DB), "the pinned connection went back to the pool")

	// While a batch holds the checkpoint, a second acquisition steps aside.
	batch, events, err = subscriptions.AcquireAndReadForTest(ctx, cps, name, 0, 10)
	require.NoError(t, err)
	require.Len(t, events, 5)
	_, _, err = subscriptions.AcquireAndReadForTest(ctx, cps, name, 0, 10)
	require.True(t, subscriptions.IsNoPipeline(err), "held checkpoint: got %v", err)

	// Savepoints, then a commit of the writes made after the rollback point.
	hctx = batch.HandlerContext(ctx)
	require.NoError(t, project(hctx, "core_pipeline_proj", events[0]))
	require.NoError(t, batch.Savepoint(ctx, "sp"))
	require.NoError(t, project(hctx, "core_pipeline_proj", events[1]))
	require.NoError(t, batch.RollbackToSavepoint(ctx, "sp"))
	require.NoError(t, batch.Commit(ctx, events[4].Position))
	require.Equal(t, []string{ids[0]}, projected(t, pg.DB, "core_pipeline_proj"))
	pos, err := cps.Position(ctx, name)
	require.NoError(t, err)
	require.Equal(t, events[4].Position, pos)
	require.Zero(t, coreInUse(t, pg.DB))

	// A failed statement aborts the transaction: the commit fails and
	// changes nothing.
	appendN(t, e.Events, "core.pipeline", 5, 1)
	batch, events, err = subscriptions.AcquireAndReadForTest(ctx, cps, name, pos, 10)
	require.NoError(t, err)
	require.Len(t, events, 1)
	require.Error(t, subscriptions.TxFromContext(batch.HandlerContext(ctx)).Exec("SELECT * FROM no_such_table").Error)
	require.Error(t, batch.Commit(ctx, events[0].Position))
	after, err := cps.Position(ctx, name)
	require.NoError(t, err)
	require.Equal(t, pos, after)
	require.Zero(t, coreInUse(t, pg.DB))
}
