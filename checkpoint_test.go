package subscriptions_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/subscriptionstest"
)

// coreAdvance sets a subscriber's checkpoint through a committed batch
// (not through Reset, which has its own tests).
func coreAdvance(t *testing.T, cps subscriptions.CheckpointStore, name string, pos int64) {
	t.Helper()
	batch, acquired, err := cps.Acquire(context.Background(), name)
	require.NoError(t, err)
	require.True(t, acquired, "name %q", name)
	require.NoError(t, batch.Commit(context.Background(), pos), "name %q", name)
}

// TestCheckpointStoreContract runs the exported CheckpointStore
// conformance suite against MemoryCheckpointStore and GormCheckpointStore
// on in-memory SQLite, file SQLite and Postgres (where the competing store
// is on a second pool, as another process's would be), on Postgres through
// WithSchema (gormStoreBackends), and on schemas goose applied from
// migrations.FS.
func TestCheckpointStoreContract(t *testing.T) {
	t.Parallel()
	subscriptionstest.RunCheckpointStoreSuite(t, subscriptionstest.CheckpointStoreHarness{
		Name:     "memory",
		Parallel: true,
		New: func(*testing.T) (subscriptions.CheckpointStore, subscriptions.CheckpointStore) {
			s := subscriptions.NewMemoryCheckpointStore()
			return s, s
		},
	})
	for _, b := range gormStoreBackends() {
		subscriptionstest.RunCheckpointStoreSuite(t, subscriptionstest.CheckpointStoreHarness{
			Name:     b.Name,
			Parallel: true,
			New: func(t *testing.T) (subscriptions.CheckpointStore, subscriptions.CheckpointStore) {
				db := openStoreDB(t, b)
				s := coreCheckpointStore(t, db.DB, db.Opts...)
				if !b.Postgres {
					return s, s
				}
				return s, coreCheckpointStore(t, db.Reopen(t), db.Opts...)
			},
			Transactional:     true,
			SerializesWriters: !b.Postgres,
		})
	}
	for _, b := range gooseEnvBackends() {
		subscriptionstest.RunCheckpointStoreSuite(t, subscriptionstest.CheckpointStoreHarness{
			Name:     b.Name,
			Parallel: true,
			New: func(t *testing.T) (subscriptions.CheckpointStore, subscriptions.CheckpointStore) {
				e := b.New(t)
				if !e.Postgres() {
					return e.Checkpoints, e.Checkpoints
				}
				other, err := subscriptions.NewGormCheckpointStore(e.PG.Open(t), subscriptions.WithSchemaVerifyOnly())
				require.NoError(t, err)
				return e.Checkpoints, other
			},
			Transactional:     true,
			SerializesWriters: !strings.HasPrefix(b.Name, "postgres"),
		})
	}
}

// TestFeedSharerContract runs the FeedSharer suite against
// GormCheckpointStore on every database, with a GormEventStore on the same
// pool (shared) and a memory store (foreign): its batches read the feed
// in their transaction, and on Postgres AcquireAfter reads it in the
// acquisition's round trip.
func TestFeedSharerContract(t *testing.T) {
	t.Parallel()
	for _, b := range dbtest.GormBackends() {
		subscriptionstest.RunFeedSharerSuite(t, subscriptionstest.FeedSharerHarness{
			Name: b.Name,
			New: func(t *testing.T) (subscriptions.CheckpointStore, domain.EventStore, domain.EventStore) {
				e := gormEnv(t, b.Name, b.Open(t), nil)
				return e.Checkpoints, e.Events, infrastructure.NewMemoryStore()
			},
		})
	}
}

// TestBatchFailureContract runs the batch-failure suite against
// MemoryCheckpointStore and GormCheckpointStore on every database
// (gormStoreBackends): on SQLite a trigger's RAISE(ROLLBACK) ends a
// batch's transaction, on Postgres a deferred foreign key makes its commit
// fail.
func TestBatchFailureContract(t *testing.T) {
	t.Parallel()
	subscriptionstest.RunBatchFailureSuite(t, subscriptionstest.BatchFailureHarness{
		Name: "memory",
		New:  func(*testing.T) subscriptions.CheckpointStore { return subscriptions.NewMemoryCheckpointStore() },
	})
	for _, b := range gormStoreBackends() {
		h := subscriptionstest.BatchFailureHarness{
			Name: b.Name,
			New: func(t *testing.T) subscriptions.CheckpointStore {
				sdb := openStoreDB(t, b)
				db := sdb.DB
				if b.Postgres {
					require.NoError(t, db.Exec("CREATE TABLE fc_parent (id integer PRIMARY KEY)").Error)
					require.NoError(t, db.Exec("CREATE TABLE fc_child (pid integer REFERENCES fc_parent (id) DEFERRABLE INITIALLY DEFERRED)").Error)
				} else {
					require.NoError(t, db.Exec("CREATE TABLE end_guard (v text)").Error)
					require.NoError(t, db.Exec("CREATE TRIGGER end_guard_refuse BEFORE INSERT ON end_guard BEGIN SELECT RAISE(ROLLBACK, 'refused'); END").Error)
				}
				return coreCheckpointStore(t, db, sdb.Opts...)
			},
		}
		if b.Postgres {
			h.FailCommit = func(t *testing.T, ctx context.Context) {
				require.NoError(t, subscriptions.TxFromContext(ctx).Exec("INSERT INTO fc_child (pid) VALUES (42)").Error)
			}
		} else {
			h.EndTx = func(t *testing.T, ctx context.Context) {
				_ = subscriptions.TxFromContext(ctx).Exec("INSERT INTO end_guard (v) VALUES ('x')").Error // swallowed
			}
		}
		subscriptionstest.RunBatchFailureSuite(t, h)
	}
}

// coreCheckpointStore is a GormCheckpointStore on db.
func coreCheckpointStore(t *testing.T, db *gorm.DB, opts ...subscriptions.GormStoreOption) subscriptions.CheckpointStore {
	t.Helper()
	s, err := subscriptions.NewGormCheckpointStore(db, opts...)
	require.NoError(t, err)
	return s
}

// TestCheckpointStoreGormTransaction covers what the conformance suite
// cannot see through the CheckpointStore interface: the batch transaction's
// writes under savepoints, hostile savepoint names, and the names as stored
// in subscriber_checkpoints; on the GORM backends and pgx.
func TestCheckpointStoreGormTransaction(t *testing.T) {
	t.Parallel()
	for _, b := range dbEnvs() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			cps := e.Checkpoints
			ctx := context.Background()

			t.Run("SavepointsUndoWrites", func(t *testing.T) {
				require.NoError(t, e.DB.Exec("CREATE TABLE core_sp (v text PRIMARY KEY)").Error)
				batch, acquired, err := cps.Acquire(ctx, "savepoints")
				require.NoError(t, err)
				require.True(t, acquired)
				hctx := batch.HandlerContext(ctx)
				require.True(t, e.InTx(hctx))
				insert := func(v string) { require.NoError(t, e.Exec(hctx, "INSERT INTO core_sp (v) VALUES (?)", v)) }
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
				require.NoError(t, e.Exec(batch.HandlerContext(ctx), "INSERT INTO core_sp (v) VALUES ('z')"))
				require.NoError(t, batch.Savepoint(ctx, "sp_one"))
				require.NoError(t, batch.Rollback())
				got = nil
				require.NoError(t, e.DB.Raw("SELECT v FROM core_sp ORDER BY v").Scan(&got).Error)
				require.Equal(t, []string{"a", "b", "e"}, got)
			})

			t.Run("HostileSavepointNamesAreRefused", func(t *testing.T) {
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

			t.Run("NamesAreStoredExactlyInTheTable", func(t *testing.T) {
				names := []string{
					`it's "quoted"`,
					`'; DROP TABLE subscriber_checkpoints; --`,
					"überprojektion-日本語-🚀",
					"e\u0301",
					"\u00e9",
					"trailing ",
					strings.Repeat("m", subscriptions.MaxSubscriberNameBytes),
				}
				for i, name := range names {
					coreAdvance(t, cps, name, int64(100+i))
				}
				var stored []string
				require.NoError(t, e.DB.Raw("SELECT subscriber FROM subscriber_checkpoints").Scan(&stored).Error)
				for _, name := range names {
					require.Contains(t, stored, name)
				}
			})
		})
	}
}

// TestCheckpointStoreAbandonedResetKeepsTheBatch: on SQLite a Reset aborts
// the batch in flight; a Reset whose context has already ended must not,
// or the batch would be thrown away although the checkpoint never moved.
func TestCheckpointStoreAbandonedResetKeepsTheBatch(t *testing.T) {
	t.Parallel()
	db := dbtest.NewSQLiteFile(t)
	cps, err := subscriptions.NewGormCheckpointStore(db)
	require.NoError(t, err)
	ctx := context.Background()
	batch, acquired, err := cps.Acquire(ctx, "core-abandoned-reset")
	require.NoError(t, err)
	require.True(t, acquired)

	rctx, cancel := context.WithCancel(ctx)
	cancel()
	err = cps.Reset(rctx, "core-abandoned-reset", 0)
	require.ErrorIs(t, err, context.Canceled)

	require.NoError(t, batch.Commit(ctx, 5), "the abandoned reset must not abort the batch")
	pos, err := cps.Position(ctx, "core-abandoned-reset")
	require.NoError(t, err)
	require.Equal(t, int64(5), pos)
}

// TestCheckpointStoreAbandonedResetReleasesItsLocksOnPostgres: a ResetWith
// or Delete abandoned while it waits for a batch's row lock must not leave
// its statement waiting on the server. A driver that gives up client-side
// leaves it there: it would take the row once the batch ends and hold it
// until the server noticed the closed socket, so the next Acquire skipped
// the row (the flaky ...WaitingForABatchHonoursCtx contract case). Here the
// batch is still in flight when the call returns, so a statement left
// behind is still waiting, and seen, every time.
func TestCheckpointStoreAbandonedResetReleasesItsLocksOnPostgres(t *testing.T) {
	t.Parallel()
	ops := []struct {
		name string
		run  func(ctx context.Context, s *subscriptions.GormCheckpointStore, name string) error
	}{
		{"ResetWith", func(ctx context.Context, s *subscriptions.GormCheckpointStore, name string) error {
			return s.ResetWith(ctx, name, 0, nil)
		}},
		{"Delete", func(ctx context.Context, s *subscriptions.GormCheckpointStore, name string) error {
			return s.Delete(ctx, name, nil)
		}},
	}
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			pg := dbtest.NewPostgres(t)
			resetter, err := subscriptions.NewGormCheckpointStore(pg.DB)
			require.NoError(t, err)
			other, err := subscriptions.NewGormCheckpointStore(pg.Open(t))
			require.NoError(t, err)
			ctx := context.Background()
			const name = "abandoned-reset-locks"
			coreAdvance(t, other, name, 5)
			batch, acquired, err := other.Acquire(ctx, name)
			require.NoError(t, err)
			require.True(t, acquired)

			// Locks that only the reset's transaction takes on the table: the
			// tuple lock of a writer waiting for the row, and the table's
			// RowExclusiveLock (the batch holds RowShareLock).
			resetLocks := func() int64 {
				var n int64
				require.NoError(t, pg.DB.Raw(`SELECT count(*) FROM pg_locks
					WHERE relation = 'subscriber_checkpoints'::regclass
					AND (locktype = 'tuple' OR mode = 'RowExclusiveLock')`).Scan(&n).Error)
				return n
			}
			require.Zero(t, resetLocks())

			rctx, cancel := context.WithCancel(ctx)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- op.run(rctx, resetter, name) }()
			require.Eventually(t, func() bool { return resetLocks() > 0 }, time.Minute, 10*time.Millisecond,
				"the %s waits for the batch's row lock", op.name)
			cancel()
			err = <-done
			require.ErrorIs(t, err, context.Canceled)
			require.Zero(t, resetLocks(), "the abandoned %s's statement still runs on the server", op.name)

			require.NoError(t, batch.Rollback())
			batch, acquired, err = other.Acquire(ctx, name)
			require.NoError(t, err)
			require.True(t, acquired, "batches resume after an abandoned %s", op.name)
			require.NoError(t, batch.Rollback())
			pos, err := other.Position(ctx, name)
			require.NoError(t, err)
			require.EqualValues(t, 5, pos, "an abandoned %s changes nothing", op.name)
		})
	}
}
