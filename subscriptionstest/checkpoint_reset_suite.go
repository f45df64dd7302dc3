package subscriptionstest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
)

// runCheckpointResetterCases is the contract of the optional
// subscriptions.CheckpointResetter, run by RunCheckpointStoreSuite for
// stores that implement it (skipped for the others).
func runCheckpointResetterCases(t *testing.T, h CheckpointStoreHarness) {
	ctx := context.Background()
	resetter := func(t *testing.T) (subscriptions.CheckpointResetter, subscriptions.CheckpointStore) {
		t.Helper()
		cps, other := h.New(t)
		r := has[subscriptions.CheckpointResetter](t, cps)
		return r, other
	}
	boom := errors.New("boom")

	t.Run("ResetWithRunsApplyInTheTransaction", func(t *testing.T) {
		r, _ := resetter(t)
		const name = "reset-with"
		advance(t, r, name, 5)
		calls := 0
		require.NoError(t, r.ResetWith(ctx, name, 2, func(ctx context.Context) error {
			calls++
			require.Equal(t, h.Transactional, h.inTx(ctx), "the transaction is in apply's context")
			return nil
		}))
		require.Equal(t, 1, calls)
		pos, err := r.Position(ctx, name)
		require.NoError(t, err)
		require.EqualValues(t, 2, pos)
		// A nil apply only moves the checkpoint, and creates it if needed.
		require.NoError(t, r.ResetWith(ctx, "reset-with-new", 9, nil))
		pos, err = r.Position(ctx, "reset-with-new")
		require.NoError(t, err)
		require.EqualValues(t, 9, pos)
		require.Error(t, r.ResetWith(ctx, name, -1, nil), "a negative position is refused")
	})

	t.Run("ResetWithFailingApplyChangesNothing", func(t *testing.T) {
		r, _ := resetter(t)
		const name = "reset-with-fails"
		advance(t, r, name, 5)
		err := r.ResetWith(ctx, name, 0, func(context.Context) error { return boom })
		require.ErrorIs(t, err, boom)
		pos, err := r.Position(ctx, name)
		require.NoError(t, err)
		require.EqualValues(t, 5, pos)
	})

	// The fenced operations: ResetWith to 0 and Delete (after which the
	// position reads 0 too).
	fencedOps := []struct {
		name string
		what string // how the store's errors name the operation
		run  func(ctx context.Context, r subscriptions.CheckpointResetter, name string, apply func(context.Context) error) error
	}{
		{"ResetWith", "reset checkpoint of", func(ctx context.Context, r subscriptions.CheckpointResetter, name string, apply func(context.Context) error) error {
			return r.ResetWith(ctx, name, 0, apply)
		}},
		{"Delete", "delete checkpoint of", func(ctx context.Context, r subscriptions.CheckpointResetter, name string, apply func(context.Context) error) error {
			return r.Delete(ctx, name, apply)
		}},
	}
	for _, op := range fencedOps {
		t.Run(op.name+"HoldsOffBatches", func(t *testing.T) {
			r, other := resetter(t)
			const name = "fence"
			advance(t, r, name, 5)
			require.NoError(t, op.run(ctx, r, name, func(context.Context) error {
				for _, s := range []subscriptions.CheckpointStore{r, other} {
					batch, acquired, err := s.Acquire(ctx, name)
					require.NoError(t, err)
					if acquired {
						_ = batch.Rollback()
					}
					require.False(t, acquired, "a batch started while the %s ran", op.name)
				}
				return nil
			}))
			batch, acquired, err := other.Acquire(ctx, name)
			require.NoError(t, err)
			require.True(t, acquired, "batches resume after the %s", op.name)
			require.Zero(t, batch.Position())
			require.NoError(t, batch.Rollback())
		})

		t.Run(op.name+"PanickingApplyReleasesTheFence", func(t *testing.T) {
			r, other := resetter(t)
			const name = "fence-panic"
			advance(t, r, name, 5)
			func() {
				defer func() { require.Equal(t, "apply panicked", recover()) }()
				_ = op.run(ctx, r, name, func(context.Context) error { panic("apply panicked") })
			}()
			pos, err := r.Position(ctx, name)
			require.NoError(t, err)
			require.EqualValues(t, 5, pos, "a panicking apply changes nothing")
			batch, acquired, err := other.Acquire(ctx, name)
			require.NoError(t, err)
			require.True(t, acquired, "batches resume after a panicking apply")
			require.NoError(t, batch.Rollback())
			require.NoError(t, op.run(ctx, r, name, nil), "another %s runs after a panicking apply", op.name)
		})

		t.Run("ResetDuring"+op.name+"IsNotLost", func(t *testing.T) {
			r, _ := resetter(t)
			const name = "fence-reset"
			advance(t, r, name, 5)
			// A plain Reset while the fence stands either fails or waits for
			// it (here until its deadline): it must not succeed and then be
			// overwritten.
			var resetErr error
			require.NoError(t, op.run(ctx, r, name, func(context.Context) error {
				short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				defer cancel()
				resetErr = r.Reset(short, name, 7)
				return nil
			}))
			pos, err := r.Position(ctx, name)
			require.NoError(t, err)
			if resetErr == nil {
				require.EqualValues(t, 7, pos, "Reset reported success during the %s, then was overwritten", op.name)
			} else {
				require.Zero(t, pos, "the %s stands", op.name)
			}
		})

		t.Run(op.name+"WaitingForABatchHonoursCtx", func(t *testing.T) {
			r, other := resetter(t)
			const name = "fence-wait"
			advance(t, r, name, 5)
			batch, acquired, err := other.Acquire(ctx, name)
			require.NoError(t, err)
			require.True(t, acquired)
			short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			err = op.run(short, r, name, nil)
			if err == nil {
				// The other way CheckpointStore.Reset allows (SQLite): the
				// operation aborts the batch in flight instead of waiting for
				// it, and the batch can no longer commit.
				require.ErrorIs(t, batch.Commit(ctx, 8), subscriptions.ErrCheckpointMoved, "the %s aborted the batch in flight", op.name)
				pos, err := r.Position(ctx, name)
				require.NoError(t, err)
				require.Zero(t, pos, "the %s stands", op.name)
				batch, acquired, err = other.Acquire(ctx, name)
				require.NoError(t, err)
				require.True(t, acquired, "batches resume after the %s", op.name)
				require.NoError(t, batch.Rollback())
				return
			}
			require.ErrorIs(t, err, context.DeadlineExceeded, "the %s waits for the batch in flight until ctx ends", op.name)
			require.Contains(t, err.Error(), op.what+` "`+name+`"`, "the error names the operation")
			require.NoError(t, batch.Rollback())
			pos, err := r.Position(ctx, name)
			require.NoError(t, err)
			require.EqualValues(t, 5, pos, "an abandoned %s changes nothing", op.name)
			// The abandoned operation's server session may still hold the
			// row for a moment after ctx ended (the cancellation reaches the
			// server asynchronously): batches resume once it lets go.
			require.Eventually(t, func() bool {
				batch, acquired, err = other.Acquire(ctx, name)
				return err == nil && acquired
			}, 10*time.Second, 5*time.Millisecond, "batches resume after an abandoned %s", op.name)
			require.NoError(t, batch.Rollback())
		})
	}

	t.Run("ResetWithIsNeverOverwrittenByABatchInFlight", func(t *testing.T) {
		r, other := resetter(t)
		const name = "reset-with-in-flight"
		advance(t, r, name, 5)
		batch, acquired, err := other.Acquire(ctx, name)
		require.NoError(t, err)
		require.True(t, acquired)
		done := make(chan error, 1)
		go func() { done <- r.ResetWith(ctx, name, 0, nil) }()
		// The batch either commits before the reset applies (which waited
		// for it) or is aborted by it; either way the reset stands.
		if err := batch.Commit(ctx, 8); err != nil {
			require.ErrorIs(t, err, subscriptions.ErrCheckpointMoved)
		}
		require.NoError(t, <-done)
		pos, err := r.Position(ctx, name)
		require.NoError(t, err)
		require.Zero(t, pos)
	})

	t.Run("DeleteForgetsTheCheckpoint", func(t *testing.T) {
		r, other := resetter(t)
		const name = "deleted"
		advance(t, r, name, 5)
		advance(t, r, "kept", 4)
		calls := 0
		require.NoError(t, r.Delete(ctx, name, func(context.Context) error { calls++; return nil }))
		require.Equal(t, 1, calls)
		pos, err := r.Position(ctx, name)
		require.NoError(t, err)
		require.Zero(t, pos)
		pos, err = r.Position(ctx, "kept")
		require.NoError(t, err)
		require.EqualValues(t, 4, pos, "other names are untouched")
		batch, acquired, err := other.Acquire(ctx, name)
		require.NoError(t, err)
		require.True(t, acquired)
		require.Zero(t, batch.Position(), "a deleted name starts again at 0")
		require.NoError(t, batch.Rollback())
		require.NoError(t, r.Delete(ctx, "never-seen", nil), "deleting an unknown name is not an error")
	})

	t.Run("DeleteFailingApplyChangesNothing", func(t *testing.T) {
		r, _ := resetter(t)
		const name = "delete-fails"
		advance(t, r, name, 5)
		require.ErrorIs(t, r.Delete(ctx, name, func(context.Context) error { return boom }), boom)
		pos, err := r.Position(ctx, name)
		require.NoError(t, err)
		require.EqualValues(t, 5, pos)
	})
}
