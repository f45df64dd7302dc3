package subscriptionstest

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
)

// RunRepartitionerSuite runs the contract of subscriptions.Repartitioner:
// catchUp gets the recorded count and the old rows' checkpoints (0 for a
// missing row) once their batches are held off, a batch in flight
// committing first or failing; while it runs no batch of the rows is
// acquired, by any replica, a missing one included; apply runs in the
// transaction; the new rows, the retired old ones and the count are then
// written together, or nothing when catchUp or apply fails.
func RunRepartitionerSuite(t *testing.T, h CheckpointStoreHarness) {
	ctx := context.Background()
	boom := errors.New("boom")
	const marker = "layout/partitions"
	from := []string{"layout/partition-0-of-3", "layout/partition-1-of-3", "layout/partition-2-of-3"}
	to := []string{"layout/partition-0-of-2", "layout/partition-1-of-2"}
	positions := func(t *testing.T, cps subscriptions.CheckpointStore, names ...string) []int64 {
		t.Helper()
		out := make([]int64, len(names))
		for i, name := range names {
			pos, err := cps.Position(ctx, name)
			require.NoError(t, err)
			out[i] = pos
		}
		return out
	}
	t.Run(h.Name+"/Repartitioner", func(t *testing.T) {
		t.Run("WritesTheLayoutInOneGo", func(t *testing.T) {
			rp, cps, other := capability[subscriptions.Repartitioner](t, h)
			advance(t, cps, from[0], 4)
			advance(t, cps, from[1], 9) // from[2] has no row
			advance(t, cps, marker, 3)
			var inHold []bool
			err := rp.Repartition(ctx, marker, from, to, 2, func(ctx context.Context, rows subscriptions.RepartitionRows, read subscriptions.RepartitionFeed) (int64, func(context.Context) error, error) {
				require.EqualValues(t, 3, rows.Recorded)
				require.Equal(t, []int64{4, 9, 0}, rows.Positions, "a missing row reads 0")
				if read != nil {
					events, err := read(ctx, 0, 9, 10)
					require.NoError(t, err, "the read of the store's own feed, in the transaction")
					require.Empty(t, events)
				}
				for _, store := range []subscriptions.CheckpointStore{cps, other} {
					for _, row := range from[:2] {
						batch, acquired, err := store.Acquire(ctx, row)
						require.NoError(t, err)
						require.False(t, acquired, "%s is held", row)
						require.Nil(t, batch)
					}
				}
				return 9, func(ctx context.Context) error {
					inHold = append(inHold, h.inTx(ctx))
					return nil
				}, nil
			})
			require.NoError(t, err)
			require.Equal(t, []bool{h.Transactional}, inHold, "apply runs once, in the transaction")
			require.Equal(t, []int64{9, 9}, positions(t, other, to...))
			require.Equal(t, []int64{subscriptions.RetiredCheckpoint, subscriptions.RetiredCheckpoint, subscriptions.RetiredCheckpoint},
				positions(t, other, from...), "the old rows, the missing one too, are retired")
			require.Equal(t, []int64{2}, positions(t, other, marker))
			batch := mustAcquire(t, other, from[2])
			require.Equal(t, subscriptions.RetiredCheckpoint, batch.Position(), "a batch of a retired row finds it retired")
			require.NoError(t, batch.Rollback())
			advance(t, other, to[0], 10)
		})
		t.Run("FailureChangesNothing", func(t *testing.T) {
			rp, cps, _ := capability[subscriptions.Repartitioner](t, h)
			advance(t, cps, from[0], 4)
			advance(t, cps, marker, 3)
			for _, tc := range []struct {
				what    string
				catchUp subscriptions.RepartitionCatchUp
			}{
				{"catchUp", func(context.Context, subscriptions.RepartitionRows, subscriptions.RepartitionFeed) (int64, func(context.Context) error, error) {
					return 0, nil, boom
				}},
				{"apply", func(context.Context, subscriptions.RepartitionRows, subscriptions.RepartitionFeed) (int64, func(context.Context) error, error) {
					return 4, func(context.Context) error { return boom }, nil
				}},
			} {
				require.ErrorIs(t, rp.Repartition(ctx, marker, from, to, 2, tc.catchUp), boom, tc.what)
				require.Equal(t, []int64{4, 0, 0}, positions(t, cps, from...), "%s failed: the old rows stay", tc.what)
				require.Equal(t, []int64{0, 0}, positions(t, cps, to...), "%s failed: no new row", tc.what)
				require.Equal(t, []int64{3}, positions(t, cps, marker))
				for _, row := range append(from, to...) {
					batch := mustAcquire(t, cps, row) // nothing is held any more
					require.NoError(t, batch.Rollback())
				}
			}
		})
		t.Run("BatchInFlightEndsFirst", func(t *testing.T) {
			rp, cps, _ := capability[subscriptions.Repartitioner](t, h)
			advance(t, cps, from[0], 4)
			batch := mustAcquire(t, cps, from[0])
			saw := make(chan []int64, 1)
			done := make(chan error, 1)
			go func() {
				done <- rp.Repartition(ctx, marker, from, to, 2, func(_ context.Context, rows subscriptions.RepartitionRows, _ subscriptions.RepartitionFeed) (int64, func(context.Context) error, error) {
					saw <- rows.Positions
					return rows.Positions[0], nil, nil
				})
			}()
			// The batch in flight commits or fails (the store decides:
			// waiting for it, or ending it), never both a commit and a
			// catch-up that did not see it.
			commitErr := batch.Commit(ctx, 8)
			require.NoError(t, <-done)
			got := <-saw
			if commitErr == nil {
				require.Equal(t, []int64{8, 0, 0}, got, "the catch-up ran before the batch it let commit")
			} else {
				require.ErrorIs(t, commitErr, subscriptions.ErrCheckpointMoved)
				require.Equal(t, []int64{4, 0, 0}, got)
			}
			require.Equal(t, []int64{got[0], got[0]}, positions(t, cps, to...))
			require.Equal(t, subscriptions.RetiredCheckpoint, positions(t, cps, from[0])[0])
		})
		t.Run("BothWaysWithOneRow", func(t *testing.T) {
			rp, cps, _ := capability[subscriptions.Repartitioner](t, h)
			const plain = "layout"
			advance(t, cps, plain, 6)
			one := func(position int64) subscriptions.RepartitionCatchUp {
				return func(context.Context, subscriptions.RepartitionRows, subscriptions.RepartitionFeed) (int64, func(context.Context) error, error) {
					return position, nil, nil
				}
			}
			require.NoError(t, rp.Repartition(ctx, marker, []string{plain}, to, 2, one(6)))
			require.Equal(t, []int64{6, 6, subscriptions.RetiredCheckpoint, 2}, positions(t, cps, to[0], to[1], plain, marker))
			advance(t, cps, to[1], 11)
			require.NoError(t, rp.Repartition(ctx, marker, to, []string{plain}, -1, one(11)))
			require.Equal(t, []int64{11, subscriptions.RetiredCheckpoint, subscriptions.RetiredCheckpoint, -1},
				positions(t, cps, plain, to[0], to[1], marker), "a count is written as given")
			advance(t, cps, plain, 12)
		})
		t.Run("CarriesTheDeliveryMarks", func(t *testing.T) {
			rp, cps, other := capability[subscriptions.Repartitioner](t, h)
			dm, ok := cps.(subscriptions.DeliveryMarker)
			if !ok {
				t.Skipf("%T is no DeliveryMarker", cps)
			}
			require.NoError(t, dm.StartCatchUp(ctx, subscriptions.PauseKey(from[0]), append([]string{marker}, from...), 20))
			for i, high := range []int64{10, 12, 11} {
				advance(t, cps, from[i], high)
				require.NoError(t, cps.Reset(ctx, from[i], int64(2+i)), "a rebuild under way: each row re-delivers up to its old checkpoint")
			}
			var saw subscriptions.RepartitionRows
			require.NoError(t, rp.Repartition(ctx, marker, from, to, 2, func(_ context.Context, rows subscriptions.RepartitionRows, _ subscriptions.RepartitionFeed) (int64, func(context.Context) error, error) {
				saw = rows
				return 4, nil, nil
			}))
			require.Equal(t, []subscriptions.DeliveryMarks{{RedeliveredThrough: 10, CatchUpThrough: 20}, {RedeliveredThrough: 12, CatchUpThrough: 20}, {RedeliveredThrough: 11, CatchUpThrough: 20}},
				saw.Marks, "catchUp gets each old row's marks, as its batch reads them")
			for _, row := range to {
				batch := mustAcquire(t, other, row)
				require.EqualValues(t, 4, batch.Position())
				require.Equal(t, subscriptions.DeliveryMarks{RedeliveredThrough: 10, CatchUpThrough: 20}, batch.(subscriptions.MarkedBatch).DeliveryMarks(),
					"%s: the lowest redelivery mark of the old rows, and the name's catch-up", row)
				require.NoError(t, batch.Rollback())
			}
		})
	})
}
