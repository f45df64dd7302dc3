package subscriptionstest

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
)

// BatchFailureHarness tells RunBatchFailureSuite how to build a checkpoint
// store and how to make its batches fail for real.
type BatchFailureHarness struct {
	// Name names the subtest the suite runs in.
	Name string
	// New returns a fresh checkpoint store.
	New func(t *testing.T) subscriptions.CheckpointStore
	// EndTx, when set, runs, in a handler's context of a batch (from
	// Batch.HandlerContext), a statement that ends the batch's transaction
	// behind its back (on SQLite a trigger's RAISE(ROLLBACK)), swallowing
	// its error as a careless handler would. Nil when the backend has no
	// such statement.
	EndTx func(t *testing.T, ctx context.Context)
	// FailCommit, when set, makes, in a handler's context of a batch, the
	// batch's commit fail because of what the handler wrote (a deferred
	// constraint, say). Nil when the backend cannot.
	FailCommit func(t *testing.T, ctx context.Context)
}

// RunBatchFailureSuite runs the contracts of the capabilities that tell a
// batch's failures apart: subscriptions.TxEndChecker (a statement that
// ended the batch transaction is reported, and the batch commits nothing),
// subscriptions.ResetAborter (a batch a reset ended says so, and its
// commit fails with ErrCheckpointMoved) and subscriptions.FailureClassifier
// (a commit the handlers made fail is the events', a lost connection is
// not), as subtests of t named h.Name/<Capability>/<case>, each skipped
// when the store (or the harness) does not have it.
func RunBatchFailureSuite(t *testing.T, h BatchFailureHarness) {
	ctx := context.Background()
	t.Run(h.Name+"/TxEndChecker", func(t *testing.T) {
		cps := h.New(t)
		advance(t, cps, "tx-end", 2)
		batch := mustAcquire(t, cps, "tx-end")
		checker, ok := batch.(subscriptions.TxEndChecker)
		if !ok {
			require.NoError(t, batch.Rollback())
			t.Skipf("%T's batches do not implement subscriptions.TxEndChecker", batch)
		}
		hctx := batch.HandlerContext(ctx)
		require.NoError(t, checker.HandlerEndedTx(hctx), "a standing transaction")
		if h.EndTx == nil {
			require.NoError(t, batch.Rollback())
			t.Skip("the harness has no statement that ends a transaction")
		}
		h.EndTx(t, hctx)
		require.ErrorIs(t, checker.HandlerEndedTx(hctx), subscriptions.ErrBatchTxEnded)
		require.Error(t, batch.Commit(ctx, 5), "a batch whose transaction ended commits nothing")
		requirePosition(t, cps, "tx-end", 2)
	})
	t.Run(h.Name+"/ResetAborter", func(t *testing.T) {
		cps := h.New(t)
		advance(t, cps, "aborted", 2)
		batch := mustAcquire(t, cps, "aborted")
		aborter, ok := batch.(subscriptions.ResetAborter)
		if !ok {
			require.NoError(t, batch.Rollback())
			t.Skipf("%T's batches do not implement subscriptions.ResetAborter", batch)
		}
		require.False(t, aborter.AbortedByReset())
		reset := make(chan error, 1)
		go func() { reset <- cps.Reset(ctx, "aborted", 0) }()
		// Either the reset ends the batch (and says so), or it waits for the
		// batch to end: then it is still running a moment later.
		var err error
		select {
		case err = <-reset:
		case <-time.After(200 * time.Millisecond):
		}
		if aborter.AbortedByReset() {
			require.NoError(t, err)
			require.ErrorIs(t, batch.Commit(ctx, 5), subscriptions.ErrCheckpointMoved)
		} else {
			require.NoError(t, batch.Rollback())
			require.NoError(t, <-reset)
		}
		requirePosition(t, cps, "aborted", 0)
	})
	t.Run(h.Name+"/FailureClassifier", func(t *testing.T) {
		cps := h.New(t)
		c := has[subscriptions.FailureClassifier](t, cps)
		for _, err := range []error{
			fmt.Errorf("commit: %w", driver.ErrBadConn), context.Canceled, context.DeadlineExceeded,
			errors.New("an error nobody recognises"),
		} {
			require.False(t, c.CommitFailedByEvents(err), "%v says nothing about the events", err)
			require.False(t, c.TxLeftFailed(err), "%v", err)
		}
		if h.FailCommit == nil {
			t.Skip("the harness cannot make a commit fail")
		}
		advance(t, cps, "commit-fails", 2)
		batch := mustAcquire(t, cps, "commit-fails")
		h.FailCommit(t, batch.HandlerContext(ctx))
		err := batch.Commit(ctx, 5)
		require.Error(t, err)
		require.True(t, c.CommitFailedByEvents(err), "the handler made it fail: %v", err)
		requirePosition(t, cps, "commit-fails", 2)
	})
}
