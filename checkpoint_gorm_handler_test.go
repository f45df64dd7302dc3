package subscriptions_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

// TestHandlerCannotEndTheBatchTransaction: Commit and Rollback on
// TxFromContext return an error wrapping sql.ErrTxDone and end nothing —
// the handler's writes stay in the batch transaction, which still works —
// and the batch then refuses to commit, changing nothing. On SQLite, on
// Postgres' ordinary path and on its pipelined (pinned connection) path;
// a replay of a parked event likewise fails and leaves the entry parked.
func TestHandlerCannotEndTheBatchTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range gormEnvs() {
		t.Run(b.Name, func(t *testing.T) {
			type acquire func(t *testing.T, e *env, name string) (subscriptions.Batch, []domain.EventEnvelope[any])
			paths := map[string]acquire{
				"ordinary": func(t *testing.T, e *env, name string) (subscriptions.Batch, []domain.EventEnvelope[any]) {
					// Read first: the in-memory SQLite database has one connection.
					events, err := e.Events.ReadAfter(ctx, 0, 10)
					require.NoError(t, err)
					batch, ok, err := e.Checkpoints.Acquire(ctx, name)
					require.NoError(t, err)
					require.True(t, ok)
					return batch, events
				},
			}
			if b.Name == "postgres" {
				paths["pipelined"] = func(t *testing.T, e *env, name string) (subscriptions.Batch, []domain.EventEnvelope[any]) {
					require.NoError(t, e.Checkpoints.Reset(ctx, name, 0))
					batch, events, err := subscriptions.AcquireAndReadForTest(ctx, e.Checkpoints.(*subscriptions.GormCheckpointStore), name, 0, 10)
					require.NoError(t, err)
					return batch, events
				}
			}
			for path, acq := range paths {
				for _, op := range []string{"Commit", "Rollback"} {
					t.Run(path+"/"+op, func(t *testing.T) {
						e := b.New(t)
						table := coreProjection(t, e.DB, "endtx")
						appendN(t, e.Events, "core.endtx", 0, 3)
						name := "core-endtx"
						batch, events := acq(t, e, name)
						t.Cleanup(func() { _ = batch.Rollback() }) // after a failure: before the schema is dropped
						require.Len(t, events, 3)
						hctx := batch.HandlerContext(ctx)
						require.NoError(t, project(hctx, table, events[0]))
						tx := subscriptions.TxFromContext(hctx)
						var err error
						require.NotPanics(t, func() {
							if op == "Commit" {
								err = tx.Commit().Error
							} else {
								err = tx.Rollback().Error
							}
						})
						require.ErrorIs(t, err, sql.ErrTxDone)
						require.Contains(t, err.Error(), op)
						// Nothing ended: the next handler writes through the same
						// transaction, and sees the first handler's write.
						require.NoError(t, project(batch.HandlerContext(ctx), table, events[1]))
						var n int
						require.NoError(t, subscriptions.TxFromContext(batch.HandlerContext(ctx)).Session(&gorm.Session{NewDB: true}).
							Raw("SELECT count(*) FROM "+table).Scan(&n).Error)
						require.Equal(t, 2, n)

						err = batch.Commit(ctx, events[2].Position)
						require.ErrorIs(t, err, sql.ErrTxDone, "the batch refuses to commit after the misuse")
						require.Empty(t, projected(t, e.DB, table), "nothing committed")
						pos, err := e.Checkpoints.Position(ctx, name)
						require.NoError(t, err)
						require.Zero(t, pos)
						require.Zero(t, coreInUse(t, e.DB), "the batch's connection went back to the pool")
					})
				}
			}

			t.Run("replay", func(t *testing.T) {
				e := b.New(t)
				table := coreProjection(t, e.DB, "endtx_replay")
				id := appendN(t, e.Events, "core.endtx", 0, 1)[0]
				ev, err := e.Events.GetEventByID(ctx, id)
				require.NoError(t, err)
				require.NoError(t, e.Parking.Park(ctx, subscriptions.ParkedEvent{Subscriber: "core-endtx", EventID: id, Position: ev.Position, Error: "x", Attempts: 1}))
				var opErr error
				err = e.Parking.Replay(ctx, "core-endtx", id, ev, func(ctx context.Context, ev domain.EventEnvelope[any]) error {
					if err := project(ctx, table, ev); err != nil {
						return err
					}
					opErr = subscriptions.TxFromContext(ctx).Commit().Error
					return nil
				})
				require.ErrorIs(t, opErr, sql.ErrTxDone)
				require.ErrorIs(t, err, sql.ErrTxDone, "the replay fails")
				require.Empty(t, projected(t, e.DB, table))
				parked, err := e.Parking.List(ctx, "core-endtx")
				require.NoError(t, err)
				require.Len(t, parked, 1, "still parked")
			})
		})
	}
}
