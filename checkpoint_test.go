package subscriptions_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// coreSecondStore returns the checkpoint store a competing process would
// use: on Postgres a GormCheckpointStore on a separate pool; elsewhere the
// same store (SQLite and memory coordinate within one process).
func coreSecondStore(t *testing.T, e *env) subscriptions.CheckpointStore {
	t.Helper()
	if !e.Postgres() {
		return e.Checkpoints
	}
	other, err := subscriptions.NewGormCheckpointStore(e.PG.Open(t))
	require.NoError(t, err)
	return other
}

// coreAdvance sets a subscriber's checkpoint through a committed batch
// (not through Reset, which has its own tests).
func coreAdvance(t *testing.T, cps subscriptions.CheckpointStore, name string, pos int64) {
	t.Helper()
	batch, acquired, err := cps.Acquire(context.Background(), name)
	require.NoError(t, err)
	require.True(t, acquired, "name %q", name)
	require.NoError(t, batch.Commit(context.Background(), pos), "name %q", name)
}

// TestCheckpointStoreContract is the behavioural suite every CheckpointStore
// must pass: MemoryCheckpointStore and GormCheckpointStore on in-memory
// SQLite, file SQLite and Postgres.
func TestCheckpointStoreContract(t *testing.T) {
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			cps := e.Checkpoints
			ctx := context.Background()

			t.Run("PositionOfUnknownIsZero", func(t *testing.T) {
				pos, err := cps.Position(ctx, "never-seen")
				require.NoError(t, err)
				require.Zero(t, pos)
			})

			t.Run("AcquireCreatesAtZero", func(t *testing.T) {
				batch, acquired, err := cps.Acquire(ctx, "created-by-acquire")
				require.NoError(t, err)
				require.True(t, acquired)
				require.NotNil(t, batch)
				require.Zero(t, batch.Position())
				// The row exists inside the batch: committing advances it.
				require.NoError(t, batch.Commit(ctx, 3))
				pos, err := cps.Position(ctx, "created-by-acquire")
				require.NoError(t, err)
				require.EqualValues(t, 3, pos)
			})

			t.Run("SecondAcquireWhileActiveIsRefused", func(t *testing.T) {
				const name = "busy"
				coreAdvance(t, cps, name, 5)
				other := coreSecondStore(t, e)

				first, acquired, err := cps.Acquire(ctx, name)
				require.NoError(t, err)
				require.True(t, acquired)

				second, acquired, err := other.Acquire(ctx, name)
				require.NoError(t, err)
				require.False(t, acquired, "a second batch of the same subscriber was acquired while the first is active")
				require.Nil(t, second)

				if e.DB == nil || e.Postgres() {
					// Another name is independent. (SQLite serializes all
					// writers: a second batch would queue on the write lock.)
					unrelated, acquired, err := other.Acquire(ctx, name+"-other")
					require.NoError(t, err)
					require.True(t, acquired)
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
				// The first batch of a brand-new subscriber creates its row; a
				// competing Acquire must not double-acquire it and must not hang.
				const name = "brand-new"
				other := coreSecondStore(t, e)
				first, acquired, err := cps.Acquire(ctx, name)
				require.NoError(t, err)
				require.True(t, acquired)
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
				const name = "commit"
				batch, acquired, err := cps.Acquire(ctx, name)
				require.NoError(t, err)
				require.True(t, acquired)
				require.NoError(t, batch.Commit(ctx, 7))
				pos, err := cps.Position(ctx, name)
				require.NoError(t, err)
				require.EqualValues(t, 7, pos)

				batch, acquired, err = cps.Acquire(ctx, name)
				require.NoError(t, err)
				require.True(t, acquired)
				require.EqualValues(t, 7, batch.Position())
				require.NoError(t, batch.Commit(ctx, 12))
				pos, err = cps.Position(ctx, name)
				require.NoError(t, err)
				require.EqualValues(t, 12, pos)
			})

			t.Run("CommitBehindStartIsRefused", func(t *testing.T) {
				const name = "behind"
				coreAdvance(t, cps, name, 10)
				batch, acquired, err := cps.Acquire(ctx, name)
				require.NoError(t, err)
				require.True(t, acquired)
				require.Error(t, batch.Commit(ctx, 4))
				pos, err := cps.Position(ctx, name)
				require.NoError(t, err)
				require.EqualValues(t, 10, pos)
				// The failed commit ended the batch: the checkpoint is free.
				batch, acquired, err = cps.Acquire(ctx, name)
				require.NoError(t, err)
				require.True(t, acquired)
				require.NoError(t, batch.Rollback())
			})

			t.Run("RollbackKeeps", func(t *testing.T) {
				const name = "rollback"
				coreAdvance(t, cps, name, 9)
				batch, acquired, err := cps.Acquire(ctx, name)
				require.NoError(t, err)
				require.True(t, acquired)
				require.NoError(t, batch.Rollback())
				pos, err := cps.Position(ctx, name)
				require.NoError(t, err)
				require.EqualValues(t, 9, pos)
				batch, acquired, err = cps.Acquire(ctx, name)
				require.NoError(t, err)
				require.True(t, acquired, "a rolled-back batch must release the checkpoint")
				require.EqualValues(t, 9, batch.Position())
				require.NoError(t, batch.Rollback())
			})

			t.Run("FinishTwiceIsErrBatchFinished", func(t *testing.T) {
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
						batch, acquired, err := cps.Acquire(ctx, name)
						require.NoError(t, err)
						require.True(t, acquired)
						require.NoError(t, tc.first(batch))
						require.ErrorIs(t, tc.second(batch), subscriptions.ErrBatchFinished)
						pos, err := cps.Position(ctx, name)
						require.NoError(t, err)
						require.Equal(t, tc.want, pos)
						// The second call did not disturb the next batch.
						next, acquired, err := cps.Acquire(ctx, name)
						require.NoError(t, err)
						require.True(t, acquired)
						require.ErrorIs(t, tc.second(batch), subscriptions.ErrBatchFinished, "a finished batch must not end its successor")
						require.NoError(t, next.Rollback())
					})
				}
			})

			t.Run("ResetCreates", func(t *testing.T) {
				const name = "created-by-reset"
				require.NoError(t, cps.Reset(ctx, name, 42))
				pos, err := cps.Position(ctx, name)
				require.NoError(t, err)
				require.EqualValues(t, 42, pos)
				batch, acquired, err := cps.Acquire(ctx, name)
				require.NoError(t, err)
				require.True(t, acquired)
				require.EqualValues(t, 42, batch.Position())
				require.NoError(t, batch.Rollback())
				// Reset moves an existing checkpoint both ways.
				require.NoError(t, cps.Reset(ctx, name, 0))
				pos, err = cps.Position(ctx, name)
				require.NoError(t, err)
				require.Zero(t, pos)
			})

			t.Run("NegativeResetIsAnError", func(t *testing.T) {
				const name = "negative"
				coreAdvance(t, cps, name, 3)
				require.Error(t, cps.Reset(ctx, name, -1))
				pos, err := cps.Position(ctx, name)
				require.NoError(t, err)
				require.EqualValues(t, 3, pos)
			})

			t.Run("HandlerContext", func(t *testing.T) {
				batch, acquired, err := cps.Acquire(ctx, "handler-context")
				require.NoError(t, err)
				require.True(t, acquired)
				defer func() { require.NoError(t, batch.Rollback()) }()
				tx := subscriptions.TxFromContext(batch.HandlerContext(ctx))
				if e.DB == nil {
					require.Nil(t, tx, "the memory store has no transaction")
					return
				}
				require.NotNil(t, tx)
				var one int
				require.NoError(t, tx.Raw("SELECT 1").Scan(&one).Error)
				require.Equal(t, 1, one)
			})

			t.Run("Savepoints", func(t *testing.T) {
				if e.DB == nil {
					batch, acquired, err := cps.Acquire(ctx, "savepoints")
					require.NoError(t, err)
					require.True(t, acquired)
					require.NoError(t, batch.Savepoint(ctx, "sp"))
					require.NoError(t, batch.RollbackToSavepoint(ctx, "sp"))
					require.NoError(t, batch.Commit(ctx, 1))
					pos, err := cps.Position(ctx, "savepoints")
					require.NoError(t, err)
					require.EqualValues(t, 1, pos)
					return
				}
				require.NoError(t, e.DB.Exec("CREATE TABLE core_sp (v text PRIMARY KEY)").Error)
				batch, acquired, err := cps.Acquire(ctx, "savepoints")
				require.NoError(t, err)
				require.True(t, acquired)
				tx := subscriptions.TxFromContext(batch.HandlerContext(ctx))
				require.NotNil(t, tx)
				insert := func(v string) { require.NoError(t, tx.Exec("INSERT INTO core_sp (v) VALUES (?)", v).Error) }
				insert("a")
				require.NoError(t, batch.Savepoint(ctx, "sp_one"))
				insert("b")
				require.NoError(t, batch.Savepoint(ctx, "sp_two"))
				insert("c")
				require.NoError(t, batch.RollbackToSavepoint(ctx, "sp_two"))
				insert("d")
				require.NoError(t, batch.RollbackToSavepoint(ctx, "sp_one"))
				insert("e")
				// b may be written again: its first write is gone.
				insert("b")
				require.NoError(t, batch.Commit(ctx, 2))
				var got []string
				require.NoError(t, e.DB.Raw("SELECT v FROM core_sp ORDER BY v").Scan(&got).Error)
				require.Equal(t, []string{"a", "b", "e"}, got)
				pos, err := cps.Position(ctx, "savepoints")
				require.NoError(t, err)
				require.EqualValues(t, 2, pos)

				// A rolled-back batch discards everything, savepoints or not.
				batch, acquired, err = cps.Acquire(ctx, "savepoints")
				require.NoError(t, err)
				require.True(t, acquired)
				tx = subscriptions.TxFromContext(batch.HandlerContext(ctx))
				require.NoError(t, tx.Exec("INSERT INTO core_sp (v) VALUES ('z')").Error)
				require.NoError(t, batch.Savepoint(ctx, "sp_one"))
				require.NoError(t, batch.Rollback())
				got = nil
				require.NoError(t, e.DB.Raw("SELECT v FROM core_sp ORDER BY v").Scan(&got).Error)
				require.Equal(t, []string{"a", "b", "e"}, got)
			})

			t.Run("HostileSavepointNamesAreRefused", func(t *testing.T) {
				if e.DB == nil {
					t.Skip("savepoints are no-ops without a transaction (covered by Savepoints)")
				}
				require.NoError(t, e.DB.Exec("CREATE TABLE y (v text)").Error)
				batch, acquired, err := cps.Acquire(ctx, "hostile-savepoint")
				require.NoError(t, err)
				require.True(t, acquired)
				for _, name := range []string{
					"x; DROP TABLE y",
					`sp"; DROP TABLE y; --`,
					"sp' OR '1'='1",
					"",
					"1starts_with_digit",
					"has space",
					"naïve",
					strings.Repeat("s", 64),
				} {
					require.Error(t, batch.Savepoint(ctx, name), "savepoint name %q", name)
					require.Error(t, batch.RollbackToSavepoint(ctx, name), "savepoint name %q", name)
				}
				// The batch is still usable and nothing was executed.
				require.NoError(t, batch.Savepoint(ctx, strings.Repeat("s", 63)))
				require.NoError(t, batch.Commit(ctx, 1))
				var n int64
				require.NoError(t, e.DB.Raw("SELECT count(*) FROM y").Scan(&n).Error, "table y must survive")
				require.Zero(t, n)
			})

			t.Run("NamesAreStoredExactly", func(t *testing.T) {
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
					coreAdvance(t, cps, name, int64(100+i))
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
				if e.DB != nil {
					var stored []string
					require.NoError(t, e.DB.Raw("SELECT subscriber FROM subscriber_checkpoints").Scan(&stored).Error)
					for _, name := range names {
						require.Contains(t, stored, name)
					}
				}
			})

			t.Run("OverlongNameIsAClearError", func(t *testing.T) {
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
						func(context.Context, coreEnvelope) error { return nil })
					require.Error(t, err)
					require.Contains(t, err.Error(), "name")
				}
			})
		})
	}
}

// TestCheckpointStoreAbandonedResetKeepsTheBatch: on SQLite a Reset marks
// the batch in flight as moved while it waits for it; a Reset given up
// (its context ends first) must not leave that mark behind, or the batch
// would be thrown away although the checkpoint never moved.
func TestCheckpointStoreAbandonedResetKeepsTheBatch(t *testing.T) {
	db := dbtest.NewSQLiteFile(t)
	cps, err := subscriptions.NewGormCheckpointStore(db)
	require.NoError(t, err)
	ctx := context.Background()
	batch, acquired, err := cps.Acquire(ctx, "core-abandoned-reset")
	require.NoError(t, err)
	require.True(t, acquired)

	rctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	err = cps.Reset(rctx, "core-abandoned-reset", 0)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	require.NoError(t, batch.Commit(ctx, 5), "the abandoned reset must not abort the batch")
	pos, err := cps.Position(ctx, "core-abandoned-reset")
	require.NoError(t, err)
	require.Equal(t, int64(5), pos)
}
