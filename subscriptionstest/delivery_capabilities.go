package subscriptionstest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
)

// RunDeliveryMarkerSuite runs the contract of subscriptions.DeliveryMarker
// and of its batches (MarkedBatch): every reset (Reset, ResetWith,
// ResetAll) records the highest checkpoint the row had as its redelivery
// mark, which every replica's batch reads with the row's lock, and never
// torn from the position it is read with; a failed reset records nothing;
// InitPartitions seeds it; StartCatchUp records a name's catch-up mark
// once, only while the name has no checkpoint row, for every row of the
// name; Delete and DeleteAll forget both.
func RunDeliveryMarkerSuite(t *testing.T, h CheckpointStoreHarness) {
	ctx := context.Background()
	boom := errors.New("boom")
	t.Run(h.Name+"/DeliveryMarker", func(t *testing.T) {
		// marksOf acquires name and returns its batch's position and marks.
		marksOf := func(t *testing.T, cps subscriptions.CheckpointStore, name string) (int64, subscriptions.DeliveryMarks) {
			t.Helper()
			batch := mustAcquire(t, cps, name)
			marked, ok := batch.(subscriptions.MarkedBatch)
			require.True(t, ok, "a batch of a DeliveryMarker is a MarkedBatch (%T)", batch)
			position, marks := batch.Position(), marked.DeliveryMarks()
			require.NoError(t, batch.Rollback())
			return position, marks
		}
		t.Run("ResetRecordsTheHighestCheckpoint", func(t *testing.T) {
			_, cps, other := capability[subscriptions.DeliveryMarker](t, h)
			const name = "redelivered"
			advance(t, cps, name, 8)
			position, marks := marksOf(t, cps, name)
			require.EqualValues(t, 8, position)
			require.Zero(t, marks.RedeliveredThrough, "no reset, no mark")

			require.NoError(t, cps.Reset(ctx, name, 3))
			for _, store := range []subscriptions.CheckpointStore{cps, other} {
				position, marks = marksOf(t, store, name)
				require.EqualValues(t, 3, position)
				require.EqualValues(t, 8, marks.RedeliveredThrough, "every replica reads the checkpoint the row had")
			}
			// The rebuild goes on; a second reset during it keeps the
			// highest earlier checkpoint.
			advance(t, cps, name, 5)
			require.NoError(t, cps.Reset(ctx, name, 1))
			position, marks = marksOf(t, other, name)
			require.EqualValues(t, 1, position)
			require.EqualValues(t, 8, marks.RedeliveredThrough, "the second reset keeps the first one's mark")
			// Past the mark, a reset records the checkpoint it moves from.
			advance(t, cps, name, 12)
			require.NoError(t, cps.Reset(ctx, name, 4))
			_, marks = marksOf(t, cps, name)
			require.EqualValues(t, 12, marks.RedeliveredThrough)

			// A reset forward redelivers nothing past its position, and a
			// row a reset creates has nothing to redeliver.
			require.NoError(t, cps.Reset(ctx, name, 20))
			position, marks = marksOf(t, cps, name)
			require.LessOrEqual(t, marks.RedeliveredThrough, position)
			require.NoError(t, cps.Reset(ctx, "created-by-reset", 6))
			_, marks = marksOf(t, cps, "created-by-reset")
			require.Zero(t, marks.RedeliveredThrough)
		})
		t.Run("ResetWithRecordsItAndAFailedOneNothing", func(t *testing.T) {
			_, cps, other := capability[subscriptions.DeliveryMarker](t, h)
			r := has[subscriptions.CheckpointResetter](t, cps)
			const name = "redelivered-with"
			advance(t, cps, name, 9)
			require.ErrorIs(t, r.ResetWith(ctx, name, 0, func(context.Context) error { return boom }), boom)
			position, marks := marksOf(t, cps, name)
			require.EqualValues(t, 9, position)
			require.Zero(t, marks.RedeliveredThrough, "a failed reset records no mark")
			require.NoError(t, r.ResetWith(ctx, name, 2, func(context.Context) error { return nil }))
			position, marks = marksOf(t, other, name)
			require.EqualValues(t, 2, position)
			require.EqualValues(t, 9, marks.RedeliveredThrough)
		})
		t.Run("ResetAllMarksEachRowAndInitPartitionsSeeds", func(t *testing.T) {
			_, cps, other := capability[subscriptions.DeliveryMarker](t, h)
			ps := has[subscriptions.PartitionCheckpointStore](t, cps)
			names := []string{"marked/partition-0-of-2", "marked/partition-1-of-2"}
			advance(t, cps, names[0], 7)
			advance(t, cps, names[1], 4)
			guard := func(context.Context) error { return nil }
			require.ErrorIs(t, ps.ResetAll(ctx, names, 0, guard, func(context.Context) error { return boom }), boom)
			_, marks := marksOf(t, cps, names[0])
			require.Zero(t, marks.RedeliveredThrough, "a failed reset records no mark")
			require.NoError(t, ps.ResetAll(ctx, names, 1, guard, nil))
			for i, want := range []int64{7, 4} {
				position, marks := marksOf(t, other, names[i])
				require.EqualValues(t, 1, position)
				require.Equal(t, want, marks.RedeliveredThrough, "each partition's own checkpoint")
			}

			// A name reset while unpartitioned and then run partitioned:
			// its partitions start at the plain checkpoint, mark included.
			advance(t, cps, "seeded", 10)
			require.NoError(t, cps.Reset(ctx, "seeded", 3))
			parts := []string{"seeded/partition-0-of-2", "seeded/partition-1-of-2"}
			existing, err := ps.InitPartitions(ctx, "seeded/partitions", "seeded", parts, 2)
			require.NoError(t, err)
			require.Zero(t, existing)
			for _, part := range parts {
				position, marks := marksOf(t, cps, part)
				require.EqualValues(t, 3, position)
				require.EqualValues(t, 10, marks.RedeliveredThrough)
			}
		})
		t.Run("StartCatchUpOnlyOnTheFirstStart", func(t *testing.T) {
			m, cps, other := capability[subscriptions.DeliveryMarker](t, h)
			rows := func(name string) []string { return []string{name, name + "/partitions"} }
			const name = "fresh"
			part := name + "/partition-1-of-3"
			require.NoError(t, m.StartCatchUp(ctx, name, rows(name), 12))
			require.NoError(t, other.(subscriptions.DeliveryMarker).StartCatchUp(ctx, name, rows(name), 30), "a replica starting at once")
			for _, row := range []string{name, part} {
				for _, store := range []subscriptions.CheckpointStore{cps, other} {
					_, marks := marksOf(t, store, row)
					require.EqualValues(t, 12, marks.CatchUpThrough, "%s: every row of the name, the first mark", row)
				}
			}
			require.NoError(t, m.StartCatchUp(ctx, name, rows(name), 40))
			_, marks := marksOf(t, cps, name)
			require.EqualValues(t, 12, marks.CatchUpThrough, "a restart keeps the first start's mark")

			// A name that has a checkpoint row (its own, or its partition
			// count's) has started before.
			advance(t, cps, "started", 2)
			advance(t, cps, "started-partitioned/partitions", 3)
			for _, started := range []string{"started", "started-partitioned"} {
				require.NoError(t, m.StartCatchUp(ctx, started, rows(started), 50))
				_, marks := marksOf(t, cps, started)
				require.Zero(t, marks.CatchUpThrough, "%s ran before", started)
			}
		})
		t.Run("DeleteForgetsTheMarks", func(t *testing.T) {
			m, cps, _ := capability[subscriptions.DeliveryMarker](t, h)
			r := has[subscriptions.CheckpointResetter](t, cps)
			rows := func(name string) []string { return []string{name, name + "/partitions"} }
			const name = "retired"
			require.NoError(t, m.StartCatchUp(ctx, name, rows(name), 9))
			advance(t, cps, name, 6)
			require.NoError(t, cps.Reset(ctx, name, 2))
			require.NoError(t, r.Delete(ctx, name, nil))
			position, marks := marksOf(t, cps, name)
			require.Zero(t, position)
			require.Equal(t, subscriptions.DeliveryMarks{}, marks, "a retired name starts afresh")

			ps, ok := cps.(subscriptions.PartitionCheckpointStore)
			if !ok {
				return
			}
			const partitioned = "retired-partitioned"
			parts := []string{partitioned + "/partition-0-of-1", partitioned + "/partitions"}
			require.NoError(t, m.StartCatchUp(ctx, partitioned, rows(partitioned), 9))
			advance(t, cps, parts[0], 6)
			require.NoError(t, ps.ResetAll(ctx, parts[:1], 1, func(context.Context) error { return nil }, nil))
			require.NoError(t, ps.DeleteAll(ctx, parts, func(context.Context) error { return nil }, nil))
			_, marks = marksOf(t, cps, parts[0])
			require.Equal(t, subscriptions.DeliveryMarks{}, marks)
		})
		t.Run("MarksAreReadWithThePosition", func(t *testing.T) {
			// Every reset here moves the row forward by one, so a row at
			// position p carries the mark p-1: a batch that read a position
			// with the mark of another version of the row would show it.
			_, cps, other := capability[subscriptions.DeliveryMarker](t, h)
			const name = "torn"
			advance(t, cps, name, 1)
			require.NoError(t, cps.Reset(ctx, name, 2))
			const resets = 200
			done := make(chan error, 1)
			go func() {
				deadline := time.Now().Add(time.Minute)
				for p := int64(3); p < 3+resets; {
					err := cps.Reset(ctx, name, p)
					switch {
					case errors.Is(err, subscriptions.ErrBatchInFlight) && time.Now().Before(deadline):
						continue // the memory store refuses while a batch runs
					case err != nil:
						done <- err
						return
					}
					p++
				}
				done <- nil
			}()
			seen := 0
			for running := true; running; {
				select {
				case err := <-done:
					require.NoError(t, err)
					running = false
				default:
				}
				batch, acquired, err := other.Acquire(ctx, name)
				require.NoError(t, err)
				if !acquired {
					continue
				}
				position, marks := batch.Position(), batch.(subscriptions.MarkedBatch).DeliveryMarks()
				require.NoError(t, batch.Rollback())
				require.Equal(t, position-1, marks.RedeliveredThrough, "position %d read with another version's mark", position)
				seen++
			}
			require.Positive(t, seen)
		})
	})
}
