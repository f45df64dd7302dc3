package subscriptions_test

import (
	"context"
	"errors"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// sqliteConstructors are the three constructors that check a SQLite
// handle.
var sqliteConstructors = []struct {
	name string
	new  func(db *gorm.DB) error
}{
	{"NewGormEventStore", func(db *gorm.DB) error { _, err := infrastructure.NewGormEventStore(db); return err }},
	{"NewGormCheckpointStore", func(db *gorm.DB) error { _, err := subscriptions.NewGormCheckpointStore(db); return err }},
	{"NewGormParkingLot", func(db *gorm.DB) error { _, err := subscriptions.NewGormParkingLot(db); return err }},
}

// TestSQLiteInMemoryPoolRefused: a private in-memory database on a pool
// that may open more than one connection is a different, empty database
// per connection (appends acknowledged on one are never delivered), so
// every constructor refuses it and names the fix; on one connection it is
// accepted and works.
func TestSQLiteInMemoryPoolRefused(t *testing.T) {
	t.Parallel()
	for _, d := range dbtest.SQLiteDrivers() {
		t.Run(d.Name, func(t *testing.T) {
			for _, dsn := range []string{":memory:", "file::memory:"} {
				for _, c := range sqliteConstructors {
					db := d.OpenDSN(t, dsn)
					err := c.new(db)
					require.Error(t, err, "%s on %s with an unbounded pool", c.name, dsn)
					require.Contains(t, err.Error(), "SetMaxOpenConns(1)", c.name)
					require.Contains(t, err.Error(), c.name)
				}
			}
			db := d.OpenDSN(t, ":memory:")
			pool, err := db.DB()
			require.NoError(t, err)
			pool.SetMaxOpenConns(1)
			for _, c := range sqliteConstructors {
				require.NoError(t, c.new(db), "%s on one connection", c.name)
			}
			// On one connection, every acknowledged append is delivered.
			store, err := infrastructure.NewGormEventStore(db)
			require.NoError(t, err)
			cps, err := subscriptions.NewGormCheckpointStore(db)
			require.NoError(t, err)
			ctx := context.Background()
			for i := range 20 {
				require.NoError(t, store.Append(ctx, "mem-agg", i, domain.NewEventEnvelope[any](map[string]any{"i": i}, "mem-agg", "mem.appended", i+1)))
			}
			var seen int
			sub, err := subscriptions.NewSubscriber("mem", store, cps, func(context.Context, domain.EventEnvelope[any]) error {
				seen++
				return nil
			}, subscriptions.WithPollInterval(10*time.Millisecond))
			require.NoError(t, err)
			r := start(t, sub)
			waitCaughtUp(t, sub)
			r.stop(t)
			require.Equal(t, 20, seen)
		})
	}
}

// TestSQLiteBusyTimeoutZeroRefused: with busy_timeout 0 every writer that
// meets a batch would fail with "database is locked"; the constructors
// refuse it and name the DSN parameter. The drivers' default (5 s) is
// accepted.
func TestSQLiteBusyTimeoutZeroRefused(t *testing.T) {
	t.Parallel()
	for _, d := range dbtest.SQLiteDrivers() {
		t.Run(d.Name, func(t *testing.T) {
			zero := "?_busy_timeout=0"
			if d.Name == "glebarez" {
				zero = "?_pragma=busy_timeout(0)"
			}
			for _, c := range sqliteConstructors {
				db := d.OpenDSN(t, "file:"+filepath.Join(t.TempDir(), "zero.db")+zero)
				err := c.new(db)
				require.Error(t, err, c.name)
				require.Contains(t, err.Error(), "busy_timeout", c.name)
				require.NoError(t, c.new(d.OpenDSN(t, filepath.Join(t.TempDir(), "plain.db"))), "%s with the driver's defaults", c.name)
			}
		})
	}
}

// TestSQLiteClosedPoolsReleased: the per-pool batch registry does not keep
// closed pools alive, so an application opening a database per tenant or
// job does not leak them.
func TestSQLiteClosedPoolsReleased(t *testing.T) {
	for _, d := range dbtest.SQLiteDrivers() {
		t.Run(d.Name, func(t *testing.T) {
			runtime.GC()
			before := subscriptions.SQLiteRegistryCountForTest()
			dir := t.TempDir()
			const pools = 40
			for i := range pools {
				func() {
					db, err := gorm.Open(d.Open(d.FileDSN(filepath.Join(dir, "tenant"+string(rune('a'+i%26))+string(rune('a'+i/26))+".db"))), &gorm.Config{})
					require.NoError(t, err)
					pool, err := db.DB()
					require.NoError(t, err)
					cps, err := subscriptions.NewGormCheckpointStore(db)
					require.NoError(t, err)
					require.NoError(t, cps.Reset(context.Background(), "tenant", 1))
					require.NoError(t, pool.Close())
				}()
			}
			require.GreaterOrEqual(t, subscriptions.SQLiteRegistryCountForTest(), before+1, "the stores registered their pools")
			require.Eventually(t, func() bool {
				runtime.GC()
				return subscriptions.SQLiteRegistryCountForTest() <= before
			}, 30*time.Second, 10*time.Millisecond, "closed pools are still registered (%d of %d)", subscriptions.SQLiteRegistryCountForTest()-before, pools)
		})
	}
}

// TestSQLiteDriverDefaultsHold: with a DSN that sets nothing (a plain
// path) or only what the original's users write (_pragma parameters, which
// gorm.io/driver/sqlite ignores), on both drivers, 4 concurrent appenders
// and 2 replicas of one subscriber projecting through the batch
// transaction never fail ("database is locked" included) and commit every
// event exactly once: the drivers' default busy timeout (5 s) and the
// store's write-first transactions are all the module needs. With a busy
// timeout of 200 ms, far shorter than 8 appenders' 800 appends take, the
// same holds because the process's appends and batches take turns on the
// file (internal/sqlitequeue): with appends alone taking turns, a batch
// failed with "database is locked" in 6 of 20 runs, and with neither,
// appends failed in 10 of 20.
func TestSQLiteDriverDefaultsHold(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name               string
		dsn                func(path string) string
		appenders, appends int
		busy               int64 // the busy timeout the DSN sets, in ms; 0: the driver's
	}{
		{"plain path", func(path string) string { return path }, 4, 25, 0},
		{"original's _pragma DSN", func(path string) string {
			return "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)"
		}, 4, 25, 0},
		{"busy timeout 200 ms", func(path string) string { // each driver reads its own parameter
			return "file:" + path + "?_busy_timeout=200&_pragma=busy_timeout(200)&_journal_mode=WAL"
		}, 8, 100, 200},
	}
	for _, d := range dbtest.SQLiteDrivers() {
		for _, c := range cases {
			t.Run(d.Name+"/"+c.name, func(t *testing.T) {
				ctx := context.Background()
				db := d.OpenDSN(t, c.dsn(filepath.Join(t.TempDir(), "app.db")))
				if c.busy > 0 {
					var busy int64
					require.NoError(t, db.Raw("PRAGMA busy_timeout").Scan(&busy).Error)
					require.Equal(t, c.busy, busy)
				}
				store, err := infrastructure.NewGormEventStore(db)
				require.NoError(t, err)
				table := coreCountProjection(t, db)
				e := &env{Name: d.Name, DB: db, Events: store}
				logger, logs := newLogger()
				var runs []*running
				for range 2 {
					cps, err := subscriptions.NewGormCheckpointStore(db)
					require.NoError(t, err)
					sub, err := subscriptions.NewSubscriber("defaults", store, cps, func(ctx context.Context, ev coreEnvelope) error {
						return coreCountEvent(ctx, e, table, ev)
					}, subscriptions.WithBatchSize(7), subscriptions.WithPollInterval(5*time.Millisecond), subscriptions.WithLogger(logger))
					require.NoError(t, err)
					runs = append(runs, start(t, sub))
				}
				errs := make(chan error, c.appenders)
				for w := range c.appenders {
					go func() {
						agg := "defaults-" + string(rune('a'+w))
						for i := range c.appends {
							if err := store.Append(ctx, agg, i, domain.NewEventEnvelope[any](map[string]any{"i": i}, agg, "defaults.appended", i+1)); err != nil {
								errs <- err
								return
							}
						}
						errs <- nil
					}()
				}
				for range c.appenders {
					require.NoError(t, <-errs)
				}
				feed, err := store.ReadAfter(ctx, 0, 0)
				require.NoError(t, err)
				require.Len(t, feed, c.appenders*c.appends)
				cps, err := subscriptions.NewGormCheckpointStore(db)
				require.NoError(t, err)
				require.Eventually(t, func() bool {
					p, err := cps.Position(ctx, "defaults")
					return err == nil && p == feed[len(feed)-1].Position
				}, time.Minute, 5*time.Millisecond, "the replicas did not catch up")
				for _, r := range runs {
					r.stop(t)
				}
				counts := coreCounts(t, db, table)
				require.Len(t, counts, len(feed))
				for _, ev := range feed {
					require.Equal(t, 1, counts[ev.ID], "event %s committed once", ev.ID)
				}
				require.NotContains(t, logs.String(), "locked")
				require.NotContains(t, logs.String(), "level=ERROR")
			})
		}
	}
}

// TestSQLiteSwitchedToWAL: a file database in the default rollback-journal
// mode is switched to WAL by the constructors (under load, writers in a
// rollback-journal database wait out the busy timeout and fail).
func TestSQLiteSwitchedToWAL(t *testing.T) {
	t.Parallel()
	for _, d := range dbtest.SQLiteDrivers() {
		for _, c := range sqliteConstructors {
			t.Run(d.Name+"/"+c.name, func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "plain.db")
				db := d.OpenDSN(t, path)
				var mode string
				require.NoError(t, db.Raw("PRAGMA journal_mode").Scan(&mode).Error)
				require.Equal(t, "delete", mode, "the driver's default")
				require.NoError(t, c.new(db))
				require.NoError(t, d.OpenDSN(t, path).Raw("PRAGMA journal_mode").Scan(&mode).Error)
				require.Equal(t, "wal", mode, "a new connection sees the database in WAL mode")
			})
		}
	}
}

// TestSQLiteAppendOutsideTheBatchFails: a handler that appends through a
// store of its own (not the batch transaction) to the file its batch
// holds cannot go before the batch, which waits for the handler: the
// append fails with "database is locked" after the busy timeout, as
// SQLite's own wait would, instead of hanging; once the handler appends
// through the batch transaction instead, the batch commits.
func TestSQLiteAppendOutsideTheBatchFails(t *testing.T) {
	t.Parallel()
	for _, d := range dbtest.SQLiteDrivers() {
		t.Run(d.Name, func(t *testing.T) {
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "app.db")
			db := d.OpenDSN(t, "file:"+path+"?_busy_timeout=200&_pragma=busy_timeout(200)&_journal_mode=WAL")
			store, err := infrastructure.NewGormEventStore(db)
			require.NoError(t, err)
			cps, err := subscriptions.NewGormCheckpointStore(db)
			require.NoError(t, err)
			require.NoError(t, store.Append(ctx, "order-1", 0, domain.NewEventEnvelope[any](map[string]any{"n": 1}, "order-1", "order.placed", 1)))

			logger, logs := newLogger()
			outside := make(chan error, 1)
			var inside atomic.Bool
			sub, err := subscriptions.NewSubscriber("reactor", store, cps, func(ctx context.Context, ev coreEnvelope) error {
				if ev.AggregateID != "order-1" {
					return nil
				}
				follow := domain.NewEventEnvelope[any](map[string]any{"n": 2}, "order-2", "order.followed", 1)
				if !inside.Load() {
					err := store.Append(ctx, "order-2", 0, follow)
					select {
					case outside <- err:
					default:
					}
					inside.Store(true)
					return err
				}
				tx := subscriptions.TxFromContext(ctx)
				if tx == nil {
					return errors.New("no batch transaction")
				}
				inTx, err := infrastructure.NewGormEventStore(tx)
				if err != nil {
					return err
				}
				return inTx.Append(ctx, "order-2", 0, follow)
			}, subscriptions.WithPollInterval(5*time.Millisecond), subscriptions.WithRetryBackoff(time.Millisecond, 5*time.Millisecond), subscriptions.WithLogger(logger))
			require.NoError(t, err)
			r := start(t, sub)
			var first error
			select {
			case first = <-outside:
			case <-time.After(time.Minute):
				t.Fatal("the handler's append outside the batch did not return")
			}
			require.ErrorContains(t, first, "database is locked")
			require.Eventually(t, func() bool {
				events, err := store.GetEvents(ctx, "order-2")
				return err == nil && len(events) == 1
			}, time.Minute, 5*time.Millisecond, "the append through the batch transaction committed")
			r.stop(t)
			require.Contains(t, logs.String(), "database is locked", "the failed attempt is logged")
		})
	}
}
