package subscriptions_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
)

// TestSQLTxFromContext: the database/sql handle is the batch transaction
// on every database backend and on both Postgres paths (the ordinary
// Acquire and the pipelined one wake-ups use): it sees the batch's GORM
// writes and GORM sees its writes, prepared statements run inside it, a
// rollback discards its writes and a commit keeps them with the
// checkpoint; a parking lot's Replay hands it over too. Outside a database
// batch there is none, nor in a batch of the pgx backend (pgxstore hands
// its handlers a pgx.Tx instead).
func TestSQLTxFromContext(t *testing.T) {
	t.Parallel()
	require.Nil(t, subscriptions.SQLTxFromContext(context.Background()))
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ctx := context.Background()
			if e.DB == nil || e.Pgx != nil {
				batch, acquired, err := e.Checkpoints.Acquire(ctx, "sqltx")
				require.NoError(t, err)
				require.True(t, acquired)
				hctx := batch.HandlerContext(ctx)
				require.Nil(t, subscriptions.SQLTxFromContext(hctx), "no database/sql transaction in memory or on pgx")
				require.Equal(t, e.Pgx != nil, e.InTx(hctx), "pgx's batch has its own transaction")
				require.NoError(t, batch.Rollback())
				return
			}
			ids := appendN(t, e.Events, "core.sqltx", 0, 5)
			events := coreFeed(t, e.Events)
			table := coreProjection(t, e.DB, "sqltx")
			const name = "core-sqltx"
			require.NoError(t, e.Checkpoints.Reset(ctx, name, 0))

			type acquire func(after int64) subscriptions.Batch
			paths := []struct {
				name    string
				acquire acquire
			}{{"ordinary", func(int64) subscriptions.Batch {
				batch, acquired, err := e.Checkpoints.Acquire(ctx, name)
				require.NoError(t, err)
				require.True(t, acquired)
				return batch
			}}}
			if e.Postgres() {
				cps := e.Checkpoints.(*subscriptions.GormCheckpointStore)
				paths = append(paths, struct {
					name    string
					acquire acquire
				}{"pipelined", func(after int64) subscriptions.Batch {
					batch, _, err := subscriptions.AcquireAndReadForTest(ctx, cps, name, after, 10)
					require.NoError(t, err)
					return batch
				}})
			}
			var want []string
			for i, path := range paths {
				ev, next := events[2*i], events[2*i+1]
				t.Run(path.name, func(t *testing.T) {
					// Rolled back: nothing stays.
					batch := path.acquire(ev.Position - 1)
					hctx := batch.HandlerContext(ctx)
					require.NoError(t, projectSQL(hctx, table, ev))
					require.NoError(t, batch.Rollback())
					require.Equal(t, want, projectedOrNil(t, e, table))

					// Committed: the handle and GORM share the transaction.
					batch = path.acquire(ev.Position - 1)
					hctx = batch.HandlerContext(ctx)
					sqlTx := subscriptions.SQLTxFromContext(hctx)
					require.NotNil(t, sqlTx)
					require.NoError(t, projectSQL(hctx, table, ev))
					require.NoError(t, project(hctx, table, next))
					var seen int
					require.NoError(t, sqlTx.QueryRowContext(hctx, "SELECT count(*) FROM "+table+" WHERE event_id IN ($1, $2)", ev.ID, next.ID).Scan(&seen))
					require.Equal(t, 2, seen, "the handle sees its own and GORM's uncommitted writes")
					stmt, err := sqlTx.PrepareContext(hctx, "SELECT position FROM "+table+" WHERE event_id = $1")
					require.NoError(t, err)
					var pos int64
					require.NoError(t, stmt.QueryRowContext(hctx, ev.ID).Scan(&pos))
					require.NoError(t, stmt.Close())
					require.Equal(t, ev.Position, pos)
					require.NoError(t, batch.Commit(ctx, next.Position))
					want = append(want, ev.ID, next.ID)
					require.Equal(t, want, projectedOrNil(t, e, table))
					cp, err := e.Checkpoints.Position(ctx, name)
					require.NoError(t, err)
					require.Equal(t, next.Position, cp)
				})
			}
			require.Equal(t, ids[:2*len(paths)], want)

			// GormParkingLot.Replay hands the handler its transaction the
			// same way.
			ev := events[4]
			require.NoError(t, e.Parking.Park(ctx, subscriptions.ParkedEvent{Subscriber: name, EventID: ev.ID,
				EventType: ev.EventType, Position: ev.Position, Error: "parked by the test", Attempts: 1}))
			require.NoError(t, e.Parking.Replay(ctx, name, ev.ID, ev, func(ctx context.Context, ev coreEnvelope) error {
				return projectSQL(ctx, table, ev)
			}))
			require.Equal(t, append(want, ev.ID), projectedOrNil(t, e, table))
			parked, err := e.Parking.List(ctx, name)
			require.NoError(t, err)
			require.Empty(t, parked)
		})
	}
}

// projectedOrNil is projected, nil (not empty) when the table is empty.
func projectedOrNil(t testing.TB, e *env, table string) []string {
	t.Helper()
	ids := projected(t, e.DB, table)
	if len(ids) == 0 {
		return nil
	}
	return ids
}
