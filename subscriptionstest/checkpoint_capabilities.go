package subscriptionstest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

// The suites of the optional capabilities of a CheckpointStore. Each runs
// as subtests of t named h.Name/<Capability>/<case>, and is skipped when
// the store does not have the capability; RunCheckpointStoreSuite runs
// them all. A backend that wants every guarantee of package subscriptions
// implements them and passes these.

// capability returns the store h builds (and its competitor) as C,
// skipping the test when it is not one.
func capability[C any](t *testing.T, h CheckpointStoreHarness) (C, subscriptions.CheckpointStore, subscriptions.CheckpointStore) {
	t.Helper()
	cps, other := h.New(t)
	return has[C](t, cps), cps, other
}

// RunAttemptCounterSuite runs the contract of subscriptions.AttemptCounter:
// a record committed by BeginAttempt is found by the next BeginAttempt of
// the same attempt, from any replica (the competitor store) and after the
// batch that wrote it rolled back (as after a crash); PutAttempt and
// FailAttempt write it, HasAttempt reads it in a batch, ClearAttempt
// removes it with the batch's commit and keeps it on rollback; a commit
// that moves the checkpoint voids it.
func RunAttemptCounterSuite(t *testing.T, h CheckpointStoreHarness) {
	ctx := context.Background()
	t.Run(h.Name+"/AttemptCounter", func(t *testing.T) {
		rec := func(pos int64, id string, through int64, n int) subscriptions.AttemptRecord {
			return subscriptions.AttemptRecord{Position: pos, EventID: id, Through: through, Attempts: n, Holder: "suite-runner"}
		}
		t.Run("BeginThenFoundByAnyReplica", func(t *testing.T) {
			ac, cps, other := capability[subscriptions.AttemptCounter](t, h)
			const name = "attempt-begin"
			advance(t, cps, name, 3)
			batch := mustAcquire(t, cps, name)
			_, found, err := ac.BeginAttempt(ctx, batch, name, rec(3, "e4", 6, 1))
			require.NoError(t, err)
			require.False(t, found, "the first attempt from 3 finds no record")
			require.NoError(t, batch.Rollback(), "as a crash would leave it")

			otherAC, ok := other.(subscriptions.AttemptCounter)
			require.True(t, ok, "the competitor is the same kind of store")
			batch = mustAcquire(t, other, name)
			prev, found, err := otherAC.BeginAttempt(ctx, batch, name, rec(3, "e4", 6, 1))
			require.NoError(t, err)
			require.True(t, found, "a replica sees the record the rolled-back batch committed")
			require.Equal(t, int64(3), prev.Position)
			require.Equal(t, "e4", prev.EventID)
			require.Equal(t, int64(6), prev.Through)
			require.Equal(t, 1, prev.Attempts)
			require.NoError(t, batch.Rollback())
		})
		t.Run("PutFailHasClear", func(t *testing.T) {
			ac, cps, _ := capability[subscriptions.AttemptCounter](t, h)
			const name = "attempt-put"
			advance(t, cps, name, 3)
			batch := mustAcquire(t, cps, name)
			require.NoError(t, ac.PutAttempt(ctx, batch, name, rec(3, "e4", 4, 2)))
			has, err := ac.HasAttempt(ctx, batch, name, 3)
			require.NoError(t, err)
			require.True(t, has)
			has, err = ac.HasAttempt(ctx, batch, name, 2)
			require.NoError(t, err)
			require.False(t, has, "a record is for one position")
			// The attempt fails: the failure keeps the count and ends the
			// batch.
			failed := rec(3, "e4", 4, 2)
			failed.LastError = "boom"
			require.NoError(t, ac.FailAttempt(ctx, batch, name, failed))
			batch = mustAcquire(t, cps, name)
			prev, found, err := ac.BeginAttempt(ctx, batch, name, rec(3, "e4", 4, 1))
			require.NoError(t, err)
			require.True(t, found)
			require.Equal(t, 2, prev.Attempts, "the failure kept the count")
			require.Equal(t, "boom", prev.LastError)

			// ClearAttempt is undone by a rollback...
			require.NoError(t, ac.ClearAttempt(ctx, batch, name))
			require.NoError(t, batch.Rollback())
			batch = mustAcquire(t, cps, name)
			has, err = ac.HasAttempt(ctx, batch, name, 3)
			require.NoError(t, err)
			require.True(t, has, "a rolled-back ClearAttempt keeps the record")
			// ...and done by a commit.
			require.NoError(t, ac.ClearAttempt(ctx, batch, name))
			require.NoError(t, batch.Commit(ctx, 3))
			batch = mustAcquire(t, cps, name)
			has, err = ac.HasAttempt(ctx, batch, name, 3)
			require.NoError(t, err)
			require.False(t, has, "a committed ClearAttempt removes the record")
			require.NoError(t, batch.Rollback())
		})
		t.Run("FailWithoutBatchAndMarker", func(t *testing.T) {
			ac, cps, _ := capability[subscriptions.AttemptCounter](t, h)
			const name = "attempt-marker"
			advance(t, cps, name, 3)
			marker := rec(3, "e6", 6, 0)
			marker.LastError = "the sixth failed after the others"
			require.NoError(t, ac.FailAttempt(ctx, nil, name, marker))
			batch := mustAcquire(t, cps, name)
			prev, found, err := ac.BeginAttempt(ctx, batch, name, rec(3, "e4", 8, 1))
			require.NoError(t, err)
			require.True(t, found, "a failure marker at the position is an earlier attempt at any first event")
			require.Zero(t, prev.Attempts)
			require.Equal(t, "e6", prev.EventID)
			require.NoError(t, batch.Rollback())
		})
		t.Run("CommitVoidsTheRecord", func(t *testing.T) {
			ac, cps, _ := capability[subscriptions.AttemptCounter](t, h)
			const name = "attempt-void"
			advance(t, cps, name, 3)
			batch := mustAcquire(t, cps, name)
			_, _, err := ac.BeginAttempt(ctx, batch, name, rec(3, "e4", 6, 1))
			require.NoError(t, err)
			require.NoError(t, batch.Commit(ctx, 6))
			batch = mustAcquire(t, cps, name)
			has, err := ac.HasAttempt(ctx, batch, name, 6)
			require.NoError(t, err)
			require.False(t, has, "the record was of the attempt from 3")
			_, found, err := ac.BeginAttempt(ctx, batch, name, rec(6, "e7", 9, 1))
			require.NoError(t, err)
			require.False(t, found, "a record of another position counts for nothing")
			require.NoError(t, batch.Rollback())
		})
	})
}

// RunPartitionCheckpointStoreSuite runs the contract of
// subscriptions.PartitionCheckpointStore: Positions reads many rows at
// once; ResetAll and DeleteAll change every row together with apply, or
// nothing when guard or apply fails; InitPartitions records the count once
// and seeds the partitions (missing or retired) from the plain
// checkpoint.
func RunPartitionCheckpointStoreSuite(t *testing.T, h CheckpointStoreHarness) {
	ctx := context.Background()
	boom := errors.New("boom")
	t.Run(h.Name+"/PartitionCheckpointStore", func(t *testing.T) {
		names := []string{"multi/partition-0-of-3", "multi/partition-1-of-3", "multi/partition-2-of-3"}
		t.Run("Positions", func(t *testing.T) {
			ps, cps, _ := capability[subscriptions.PartitionCheckpointStore](t, h)
			advance(t, cps, names[0], 4)
			advance(t, cps, names[2], 9)
			got, err := ps.Positions(ctx, names)
			require.NoError(t, err)
			require.Equal(t, []int64{4, 0, 9}, got, "a name without a row reads 0")
		})
		t.Run("ResetAllWithGuardAndApply", func(t *testing.T) {
			ps, cps, _ := capability[subscriptions.PartitionCheckpointStore](t, h)
			for i, name := range names {
				advance(t, cps, name, int64(5+i))
			}
			applied := false
			err := ps.ResetAll(ctx, names, 1, func(context.Context) error { return boom }, func(context.Context) error { applied = true; return nil })
			require.ErrorIs(t, err, boom)
			require.False(t, applied, "a failing guard runs before apply")
			got, err := ps.Positions(ctx, names)
			require.NoError(t, err)
			require.Equal(t, []int64{5, 6, 7}, got, "a failing guard changes nothing")
			require.ErrorIs(t, ps.ResetAll(ctx, names, 1, func(context.Context) error { return nil }, func(context.Context) error { return boom }), boom)
			got, err = ps.Positions(ctx, names)
			require.NoError(t, err)
			require.Equal(t, []int64{5, 6, 7}, got, "a failing apply changes nothing")
			require.NoError(t, ps.ResetAll(ctx, names, 1, func(context.Context) error { return nil }, func(context.Context) error { applied = true; return nil }))
			require.True(t, applied)
			got, err = ps.Positions(ctx, names)
			require.NoError(t, err)
			require.Equal(t, []int64{1, 1, 1}, got)
			require.NoError(t, ps.ResetAll(ctx, names, 2, func(context.Context) error { return nil }, nil), "a nil apply")
			got, err = ps.Positions(ctx, names)
			require.NoError(t, err)
			require.Equal(t, []int64{2, 2, 2}, got)
		})
		t.Run("DeleteAll", func(t *testing.T) {
			ps, cps, _ := capability[subscriptions.PartitionCheckpointStore](t, h)
			for _, name := range names {
				advance(t, cps, name, 5)
			}
			guardSaw := int64(-1)
			require.NoError(t, ps.DeleteAll(ctx, names, func(ctx context.Context) error {
				got, err := ps.Positions(ctx, names[:1])
				guardSaw = got[0]
				return err
			}, nil))
			require.EqualValues(t, 5, guardSaw, "the guard runs before anything is deleted")
			got, err := ps.Positions(ctx, names)
			require.NoError(t, err)
			require.Equal(t, []int64{0, 0, 0}, got)
		})
		t.Run("InitPartitions", func(t *testing.T) {
			ps, cps, other := capability[subscriptions.PartitionCheckpointStore](t, h)
			advance(t, cps, "multi", 7)
			advance(t, cps, names[1], 9)                               // a row of its own already
			advance(t, cps, names[2], subscriptions.RetiredCheckpoint) // left by a Repartition
			existing, err := ps.InitPartitions(ctx, "multi/partitions", "multi", names, 3)
			require.NoError(t, err)
			require.Zero(t, existing, "the first call records the count")
			got, err := ps.Positions(ctx, names)
			require.NoError(t, err)
			require.Equal(t, []int64{7, 9, 7}, got, "partitions without a row, or with a retired one, start at the plain checkpoint")
			otherPS := other.(subscriptions.PartitionCheckpointStore)
			existing, err = otherPS.InitPartitions(ctx, "multi/partitions", "multi", names[:2], 2)
			require.NoError(t, err)
			require.EqualValues(t, 3, existing, "a later call, from any replica, gets the recorded count")
		})
	})
}

// RunPauserSuite runs the contract of subscriptions.Pauser: Pause returns
// the paused rows' checkpoints once no batch of them is in flight, after
// which no batch of them is acquired (as if held) nor committed, from
// any replica, rows paused under the subscriber's name by PauseKey
// included; PausedSince reports it with its reason (a second Pause keeps
// the first); Resume lifts it.
func RunPauserSuite(t *testing.T, h CheckpointStoreHarness) {
	ctx := context.Background()
	t.Run(h.Name+"/Pauser", func(t *testing.T) {
		t.Run("PauseStopsEveryRowAndReplica", func(t *testing.T) {
			p, cps, other := capability[subscriptions.Pauser](t, h)
			const name = "paused"
			part := name + "/partition-0-of-2"
			require.Equal(t, name, subscriptions.PauseKey(part))
			advance(t, cps, name, 4)
			advance(t, cps, part, 6)
			positions, err := p.Pause(ctx, name, []string{name, part}, "suite")
			require.NoError(t, err)
			require.Equal(t, []int64{4, 6}, positions)
			rec, paused, err := p.PausedSince(ctx, name)
			require.NoError(t, err)
			require.True(t, paused)
			require.False(t, rec.Since.IsZero())
			require.Equal(t, "suite", rec.Reason)
			_, err = p.Pause(ctx, name, []string{name, part}, "a second pause")
			require.NoError(t, err)
			again, paused, err := other.(subscriptions.Pauser).PausedSince(ctx, name)
			require.NoError(t, err)
			require.True(t, paused)
			require.Equal(t, rec, again, "a second Pause keeps the first, read from any replica")
			for _, store := range []subscriptions.CheckpointStore{cps, other} {
				for _, row := range []string{name, part} {
					batch, acquired, err := store.Acquire(ctx, row)
					require.NoError(t, err)
					require.False(t, acquired, "%s is paused", row)
					require.Nil(t, batch)
				}
			}
			_, paused, err = p.PausedSince(ctx, "other-name")
			require.NoError(t, err)
			require.False(t, paused, "only the key is paused")
			advance(t, cps, "other-name", 1)

			require.NoError(t, other.(subscriptions.Pauser).Resume(ctx, name))
			require.NoError(t, p.Resume(ctx, name), "resuming a name that is not paused is no error")
			advance(t, cps, name, 5)
			advance(t, other, part, 7)
		})
		t.Run("BatchInFlightNeverCommitsAfterPause", func(t *testing.T) {
			p, cps, _ := capability[subscriptions.Pauser](t, h)
			const name = "paused-inflight"
			advance(t, cps, name, 4)
			batch := mustAcquire(t, cps, name)
			paused := make(chan []int64, 1)
			pauseErr := make(chan error, 1)
			go func() {
				positions, err := p.Pause(ctx, name, []string{name}, "")
				pauseErr <- err
				paused <- positions
			}()
			// The batch in flight commits or fails; the store decides which
			// (waiting for it, or ending it), never both a commit and a
			// Pause that returned before it.
			commitErr := batch.Commit(ctx, 8)
			require.NoError(t, <-pauseErr)
			positions := <-paused
			if commitErr == nil {
				require.Equal(t, []int64{8}, positions, "Pause returned before the batch it let commit")
			} else {
				require.ErrorIs(t, commitErr, subscriptions.ErrCheckpointMoved)
				require.Equal(t, []int64{4}, positions)
			}
			requirePosition(t, cps, name, positions[0])
			_, acquired, err := cps.Acquire(ctx, name)
			require.NoError(t, err)
			require.False(t, acquired)
			require.NoError(t, p.Resume(ctx, name))
		})
	})
}

// FeedSharerHarness tells RunFeedSharerSuite how to build a checkpoint
// store and an event store on the same database.
type FeedSharerHarness struct {
	// Name names the subtest the suite runs in.
	Name string
	// New returns a fresh checkpoint store, an event store it shares
	// (SharesFeed true), and one it does not (on another database or of
	// another kind).
	New func(t *testing.T) (checkpoints subscriptions.CheckpointStore, shared, foreign domain.EventStore)
}

// RunFeedSharerSuite runs the contract of subscriptions.FeedSharer and of
// what it promises: the shared store's batches read its events by position
// in their transaction (BatchFeedReader) and, for a FeedAcquirer,
// AcquireAfter reads the events ReadAfter reads, or declines holding
// nothing.
func RunFeedSharerSuite(t *testing.T, h FeedSharerHarness) {
	ctx := context.Background()
	t.Run(h.Name+"/FeedSharer", func(t *testing.T) {
		cps, shared, foreign := h.New(t)
		sharer := has[subscriptions.FeedSharer](t, cps)
		require.True(t, sharer.SharesFeed(shared))
		require.False(t, sharer.SharesFeed(foreign))
		var appended []domain.EventEnvelope[any]
		for i := range 5 {
			ev := domain.NewEventEnvelope[any](map[string]any{"i": i}, fmt.Sprintf("agg-%d", i%2), "suite.shared", 0)
			require.NoError(t, shared.Append(ctx, ev.AggregateID, -1, ev))
			appended = append(appended, ev)
		}
		feed, err := shared.ReadAfter(ctx, 0, 0)
		require.NoError(t, err)
		require.Len(t, feed, len(appended))

		batch := mustAcquire(t, cps, "shared-reader")
		reader, ok := batch.(subscriptions.BatchFeedReader)
		require.True(t, ok, "a batch of a FeedSharer reads the shared feed")
		got, err := reader.ReadPositions(ctx, []int64{feed[3].Position, feed[1].Position, feed[4].Position + 100})
		require.NoError(t, err)
		require.Equal(t, []string{feed[1].ID, feed[3].ID}, ids(got), "in position order, a missing one left out")
		require.NoError(t, batch.Rollback())

		fa, ok := cps.(subscriptions.FeedAcquirer)
		if !ok {
			return
		}
		advance(t, cps, "shared-acquirer", feed[1].Position)
		batch, events, ok, err := fa.AcquireAfter(ctx, "shared-acquirer", feed[1].Position, 2)
		require.NoError(t, err)
		if !ok {
			require.Nil(t, batch, "a declined AcquireAfter holds nothing")
			advance(t, cps, "shared-acquirer", feed[1].Position) // the checkpoint is free
			return
		}
		require.Equal(t, feed[1].Position, batch.Position())
		require.Equal(t, []string{feed[2].ID, feed[3].ID}, ids(events))
		require.NoError(t, batch.Commit(ctx, feed[3].Position))
		requirePosition(t, cps, "shared-acquirer", feed[3].Position)

		// An AcquireAfter batch answers HasAttempt as any batch does, the
		// record as it stands once the row is locked (an acquirer may read
		// it in the same round trip).
		ac, ok := cps.(subscriptions.AttemptCounter)
		if !ok {
			return
		}
		const name = "shared-attempts"
		at := feed[1].Position
		advance(t, cps, name, at)
		batch = mustAcquire(t, cps, name)
		require.NoError(t, ac.PutAttempt(ctx, batch, name, subscriptions.AttemptRecord{Position: at, EventID: feed[2].ID, Through: feed[2].Position, Attempts: 1}))
		require.NoError(t, batch.Rollback(), "the record stays, as after a crash")
		batch, _, ok, err = fa.AcquireAfter(ctx, name, at, 2)
		require.NoError(t, err)
		require.True(t, ok, "AcquireAfter took the row above")
		has, err := ac.HasAttempt(ctx, batch, name, at)
		require.NoError(t, err)
		require.True(t, has, "the record a crashed batch left")
		has, err = ac.HasAttempt(ctx, batch, name, at-1)
		require.NoError(t, err)
		require.False(t, has, "a record is for one position")
		require.NoError(t, ac.ClearAttempt(ctx, batch, name))
		has, err = ac.HasAttempt(ctx, batch, name, at)
		require.NoError(t, err)
		require.False(t, has, "the batch's own ClearAttempt")
		require.NoError(t, batch.Commit(ctx, at))
		batch, _, ok, err = fa.AcquireAfter(ctx, name, at, 2)
		require.NoError(t, err)
		require.True(t, ok)
		has, err = ac.HasAttempt(ctx, batch, name, at)
		require.NoError(t, err)
		require.False(t, has, "the committed ClearAttempt removed it")
		require.NoError(t, batch.Rollback())
	})
}

func ids(events []domain.EventEnvelope[any]) []string {
	out := make([]string, len(events))
	for i, ev := range events {
		out[i] = ev.ID
	}
	return out
}
