package subscriptionstest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
)

// CheckpointStoreHarness tells RunCheckpointStoreSuite how to build the
// subscriptions.CheckpointStore under test.
type CheckpointStoreHarness struct {
	// Name names the subtest the suite runs in ("memory", "postgres", ...).
	Name string
	// New returns a fresh, empty store for one test, and the store a
	// competing process would use over the same data: a second store on
	// its own connection pool where the backend coordinates across
	// processes (Postgres), or store itself where it coordinates within one
	// process (memory, SQLite). Release what it opens with t.Cleanup.
	New func(t *testing.T) (store, competitor subscriptions.CheckpointStore)
	// Transactional reports that a batch runs in a database transaction,
	// handed to handlers through subscriptions.TxFromContext on
	// Batch.HandlerContext.
	Transactional bool
	// InTx reports whether ctx carries a usable transaction of the
	// backend (a SELECT 1 through it succeeds): the one handed to
	// handlers, resets and replays. Nil means subscriptions.TxFromContext,
	// the *gorm.DB of this module's GORM backend; a backend whose handlers
	// get another kind of transaction (pgxstore's pgx.Tx) sets it.
	InTx func(ctx context.Context) bool
	// SerializesWriters reports that one batch in flight blocks every
	// other batch, whatever its subscriber (SQLite's single write lock):
	// the suite then does not check that another name is independent.
	SerializesWriters bool
	// Parallel runs this backend's cases alongside the test binary's other
	// parallel tests (t.Parallel on the Name subtest, so that the suites of
	// several backends overlap while each waits on its database). Set it
	// when New's stores share nothing with other tests, e.g. a database or
	// schema of their own. The cases of one backend still run one after
	// another.
	Parallel bool
}

// RunCheckpointStoreSuite runs the behavioural contract of
// subscriptions.CheckpointStore against the store h builds, as subtests of
// t named h.Name/<case>, then the suites of the optional capabilities the
// store has (RunAttemptCounterSuite, RunPartitionCheckpointStoreSuite,
// RunPauserSuite, RunDeliveryMarkerSuite, RunRepartitionerSuite;
// CheckpointResetter's cases run within). Every case gets a fresh store from h.New. Cases
// run one after another; a case may run goroutines of its own, all ended
// before it returns.
func RunCheckpointStoreSuite(t *testing.T, h CheckpointStoreHarness) {
	ctx := context.Background()
	t.Run(h.Name, func(t *testing.T) {
		if h.Parallel {
			t.Parallel()
		}
		t.Run("PositionOfUnknownIsZero", func(t *testing.T) {
			cps, _ := h.New(t)
			requirePosition(t, cps, "never-seen", 0)
		})

		t.Run("AcquireCreatesAtZero", func(t *testing.T) {
			cps, _ := h.New(t)
			batch := mustAcquire(t, cps, "created-by-acquire")
			require.NotNil(t, batch)
			require.Zero(t, batch.Position())
			// The row exists inside the batch: committing advances it.
			require.NoError(t, batch.Commit(ctx, 3))
			requirePosition(t, cps, "created-by-acquire", 3)
		})

		t.Run("SecondAcquireWhileActiveIsRefused", func(t *testing.T) {
			cps, other := h.New(t)
			const name = "busy"
			advance(t, cps, name, 5)

			first := mustAcquire(t, cps, name)

			second, acquired, err := other.Acquire(ctx, name)
			require.NoError(t, err)
			require.False(t, acquired, "a second batch of the same subscriber was acquired while the first is active")
			require.Nil(t, second)

			if !h.SerializesWriters {
				// Another name is independent. (SQLite serializes all
				// writers: a second batch would queue on the write lock.)
				unrelated := mustAcquire(t, other, name+"-other")
				require.NoError(t, unrelated.Rollback())
			}

			require.NoError(t, first.Rollback())
			second, acquired, err = other.Acquire(ctx, name)
			require.NoError(t, err)
			require.True(t, acquired, "the checkpoint must be acquirable once the first batch ended")
			require.EqualValues(t, 5, second.Position())
			require.NoError(t, second.Rollback())
		})

		t.Run("SecondAcquireOfANewNameIsRefused", func(t *testing.T) {
			cps, other := h.New(t)
			// The first batch of a brand-new subscriber creates its row; a
			// competing Acquire must not double-acquire it and must not hang.
			const name = "brand-new"
			first := mustAcquire(t, cps, name)
			defer func() { _ = first.Rollback() }()

			type result struct {
				batch    subscriptions.Batch
				acquired bool
				err      error
			}
			got := make(chan result, 1)
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			go func() {
				b, ok, err := other.Acquire(actx, name)
				got <- result{b, ok, err}
			}()
			var res result
			select {
			case res = <-got:
			case <-time.After(20 * time.Second):
				t.Fatal("second Acquire neither returned nor timed out")
			}
			if res.batch != nil {
				_ = res.batch.Rollback()
			}
			require.NoError(t, res.err, "the second Acquire blocked on the first batch's uncommitted row instead of skipping")
			require.False(t, res.acquired)
		})

		t.Run("CommitAdvances", func(t *testing.T) {
			cps, _ := h.New(t)
			const name = "commit"
			batch := mustAcquire(t, cps, name)
			require.NoError(t, batch.Commit(ctx, 7))
			requirePosition(t, cps, name, 7)

			batch = mustAcquire(t, cps, name)
			require.EqualValues(t, 7, batch.Position())
			require.NoError(t, batch.Commit(ctx, 12))
			requirePosition(t, cps, name, 12)
		})

		t.Run("CommitBehindStartIsRefused", func(t *testing.T) {
			cps, _ := h.New(t)
			const name = "behind"
			advance(t, cps, name, 10)
			batch := mustAcquire(t, cps, name)
			require.Error(t, batch.Commit(ctx, 4))
			requirePosition(t, cps, name, 10)
			// The failed commit ended the batch: the checkpoint is free.
			batch = mustAcquire(t, cps, name)
			require.NoError(t, batch.Rollback())
		})

		t.Run("RollbackKeeps", func(t *testing.T) {
			cps, _ := h.New(t)
			const name = "rollback"
			advance(t, cps, name, 9)
			batch := mustAcquire(t, cps, name)
			require.NoError(t, batch.Rollback())
			requirePosition(t, cps, name, 9)
			batch, acquired, err := cps.Acquire(ctx, name)
			require.NoError(t, err)
			require.True(t, acquired, "a rolled-back batch must release the checkpoint")
			require.EqualValues(t, 9, batch.Position())
			require.NoError(t, batch.Rollback())
		})

		t.Run("FinishTwiceIsErrBatchFinished", func(t *testing.T) {
			cps, _ := h.New(t)
			type op func(subscriptions.Batch) error
			commit := func(b subscriptions.Batch) error { return b.Commit(ctx, b.Position()+1) }
			rollback := func(b subscriptions.Batch) error { return b.Rollback() }
			cases := []struct {
				name          string
				first, second op
				want          int64 // position after both
			}{
				{"commit-commit", commit, commit, 1},
				{"commit-rollback", commit, rollback, 1},
				{"rollback-rollback", rollback, rollback, 0},
				{"rollback-commit", rollback, commit, 0},
			}
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					name := "twice-" + tc.name
					batch := mustAcquire(t, cps, name)
					require.NoError(t, tc.first(batch))
					require.ErrorIs(t, tc.second(batch), subscriptions.ErrBatchFinished)
					pos, err := cps.Position(ctx, name)
					require.NoError(t, err)
					require.Equal(t, tc.want, pos)
					// The second call did not disturb the next batch.
					next := mustAcquire(t, cps, name)
					require.ErrorIs(t, tc.second(batch), subscriptions.ErrBatchFinished, "a finished batch must not end its successor")
					require.NoError(t, next.Rollback())
				})
			}
		})

		t.Run("ResetCreates", func(t *testing.T) {
			cps, _ := h.New(t)
			const name = "created-by-reset"
			require.NoError(t, cps.Reset(ctx, name, 42))
			requirePosition(t, cps, name, 42)
			batch := mustAcquire(t, cps, name)
			require.EqualValues(t, 42, batch.Position())
			require.NoError(t, batch.Rollback())
			// Reset moves an existing checkpoint both ways.
			require.NoError(t, cps.Reset(ctx, name, 0))
			requirePosition(t, cps, name, 0)
		})

		t.Run("NegativeResetIsAnError", func(t *testing.T) {
			cps, _ := h.New(t)
			const name = "negative"
			advance(t, cps, name, 3)
			require.Error(t, cps.Reset(ctx, name, -1))
			requirePosition(t, cps, name, 3)
		})

		t.Run("HandlerContext", func(t *testing.T) {
			cps, _ := h.New(t)
			batch := mustAcquire(t, cps, "handler-context")
			defer func() { require.NoError(t, batch.Rollback()) }()
			require.Equal(t, h.Transactional, h.inTx(batch.HandlerContext(ctx)),
				"a transactional store hands its transaction to handlers, and a store without transactions hands out none")
		})

		t.Run("Savepoints", func(t *testing.T) {
			// Savepoint and RollbackToSavepoint with a valid name succeed
			// on every store (no-ops without a transaction); what they
			// undo inside a transaction is the backend's own test.
			cps, _ := h.New(t)
			batch := mustAcquire(t, cps, "savepoints")
			require.NoError(t, batch.Savepoint(ctx, "sp"))
			require.NoError(t, batch.RollbackToSavepoint(ctx, "sp"))
			require.NoError(t, batch.Commit(ctx, 1))
			requirePosition(t, cps, "savepoints", 1)
		})

		t.Run("NamesAreStoredExactly", func(t *testing.T) {
			cps, _ := h.New(t)
			names := []string{
				`it's "quoted"`,
				`'; DROP TABLE subscriber_checkpoints; --`,
				"semi;colon",
				"back\\slash and %_ wildcards",
				"überprojektion-日本語-🚀",
				"e\u0301", // decomposed é: distinct from the composed one
				"\u00e9",
				"trailing ",
				"trailing",
				"Trailing",
				strings.Repeat("n", 1000),
				strings.Repeat("m", subscriptions.MaxSubscriberNameBytes),
			}
			for i, name := range names {
				advance(t, cps, name, int64(100+i))
			}
			for i, name := range names {
				pos, err := cps.Position(ctx, name)
				require.NoError(t, err)
				require.EqualValues(t, 100+i, pos, "name %q", name)
				batch, acquired, err := cps.Acquire(ctx, name)
				require.NoError(t, err)
				require.True(t, acquired, "name %q", name)
				require.EqualValues(t, 100+i, batch.Position(), "name %q", name)
				require.NoError(t, batch.Commit(ctx, int64(1000+i)))
			}
			for i, name := range names {
				pos, err := cps.Position(ctx, name)
				require.NoError(t, err)
				require.EqualValues(t, 1000+i, pos, "name %q", name)
			}
		})

		t.Run("OverlongNameIsAClearError", func(t *testing.T) {
			cps, _ := h.New(t)
			for _, name := range []string{
				strings.Repeat("x", subscriptions.MaxSubscriberNameBytes+1),
				// 513 four-byte runes: fewer characters than the limit, more bytes.
				strings.Repeat("🚀", subscriptions.MaxSubscriberNameBytes/4+1),
			} {
				_, acquired, err := cps.Acquire(ctx, name)
				require.Error(t, err)
				require.False(t, acquired)
				require.Contains(t, err.Error(), "bytes")
				err = cps.Reset(ctx, name, 1)
				require.Error(t, err)
				require.Contains(t, err.Error(), "bytes")
				_, err = subscriptions.NewSubscriber(name, infrastructure.NewMemoryStore(), cps,
					func(context.Context, domain.EventEnvelope[any]) error { return nil })
				require.Error(t, err)
				require.Contains(t, err.Error(), "name")
			}
		})

		runCheckpointResetterCases(t, h)
	})
	RunAttemptCounterSuite(t, h)
	RunPartitionCheckpointStoreSuite(t, h)
	RunPauserSuite(t, h)
	RunDeliveryMarkerSuite(t, h)
	RunRepartitionerSuite(t, h)
}

// advance sets a subscriber's checkpoint through a committed batch (not
// through Reset, which has its own cases).
func advance(t *testing.T, cps subscriptions.CheckpointStore, name string, pos int64) {
	t.Helper()
	batch, acquired, err := cps.Acquire(context.Background(), name)
	require.NoError(t, err)
	require.True(t, acquired, "name %q", name)
	require.NoError(t, batch.Commit(context.Background(), pos), "name %q", name)
}

// mustAcquire acquires name's checkpoint and fails the test unless the
// batch is granted.
func mustAcquire(t *testing.T, cps subscriptions.CheckpointStore, name string) subscriptions.Batch {
	t.Helper()
	batch, acquired, err := cps.Acquire(context.Background(), name)
	require.NoError(t, err)
	require.True(t, acquired)
	return batch
}

// requirePosition fails unless name's committed position is want.
func requirePosition(t *testing.T, cps subscriptions.CheckpointStore, name string, want int64) {
	t.Helper()
	pos, err := cps.Position(context.Background(), name)
	require.NoError(t, err)
	require.EqualValues(t, want, pos)
}

// inTx reports whether ctx carries the backend's transaction (InTx).
func (h CheckpointStoreHarness) inTx(ctx context.Context) bool { return inTx(h.InTx, ctx) }

// inTx is InTx, or the GORM transaction's check when the harness has none.
func inTx(f func(ctx context.Context) bool, ctx context.Context) bool {
	if f != nil {
		return f(ctx)
	}
	tx := subscriptions.TxFromContext(ctx)
	if tx == nil {
		return false
	}
	var one int
	return tx.Raw("SELECT 1").Scan(&one).Error == nil && one == 1
}
