package migrations_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/migrations"
)

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestBadHandles: a nil or unopened handle is an error, never a panic.
func TestBadHandles(t *testing.T) {
	for _, db := range []*gorm.DB{nil, {}} {
		require.ErrorContains(t, migrations.Migrate(context.Background(), db), "unopened")
		require.ErrorContains(t, migrations.Verify(context.Background(), db), "unopened")
	}
}

// TestMigrateAndVerify: Verify names what is missing and the file that
// adds it, in one error wrapping ErrSchemaMismatch; Migrate creates the
// schema once and is then a no-op; a schema changed behind the module's
// back is reported precisely.
func TestMigrateAndVerify(t *testing.T) {
	for _, b := range dbtest.GormBackends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := testCtx(t)
			dir := "sqlite/"
			if b.Postgres {
				dir = "postgres/"
			}
			file, file2, file7 := dir+"00001_create_tables.up.sql", dir+"00002_parked_aggregate_id.up.sql", dir+"00007_parked_queues.up.sql"

			t.Run("empty database", func(t *testing.T) {
				db := b.Open(t)
				err := migrations.Verify(ctx, db)
				require.ErrorIs(t, err, migrations.ErrSchemaMismatch)
				for _, want := range []string{
					"missing table events (added by " + file + ")",
					"missing table subscriber_checkpoints (added by " + file + ")",
					"missing table parked_events (added by " + file + ")",
					"migration " + file + " is not recorded",
					"migrations.Migrate",
				} {
					require.ErrorContains(t, err, want)
				}
				require.NotContains(t, err.Error(), "missing column events.", "a missing table is reported once, not per column")
				require.Empty(t, catalog(t, db), "Verify changes nothing")

				require.NoError(t, migrations.Migrate(ctx, db))
				require.NoError(t, migrations.Verify(ctx, db))
				before := catalog(t, db)
				require.NoError(t, migrations.Migrate(ctx, db), "a second Migrate is a no-op")
				require.Equal(t, before, catalog(t, db))
			})

			tampered := []struct {
				name         string
				change       string
				want         string
				postgresOnly bool
			}{
				{"index dropped", "DROP INDEX idx_events_transaction_id", "missing index idx_events_transaction_id (added by " + file + ")", false},
				{"other index dropped", "DROP INDEX idx_parked_events_position", "missing index idx_parked_events_position (added by " + file + ")", false},
				{"unique constraint dropped", "ALTER TABLE events DROP CONSTRAINT events_position_key", "missing unique index on events (position) (added by " + file + ")", true},
				{"trigger dropped", "DROP TRIGGER parked_events_keys ON parked_events", "missing trigger parked_events_keys on parked_events (added by " + file + ")", true},
				{"column dropped", "ALTER TABLE subscriber_checkpoints DROP COLUMN updated_at", "missing column subscriber_checkpoints.updated_at (added by " + file + ")", false},
				{"table dropped", "DROP TABLE parked_events", "missing table parked_events (added by " + file + ")", false},
				{"migration not recorded", "DELETE FROM " + migrations.VersionTable + " WHERE version = 1", "migration " + file + " is not recorded in " + migrations.VersionTable, false},
				{"redelivery column dropped", "ALTER TABLE subscriber_checkpoints DROP COLUMN redelivered_through", "missing column subscriber_checkpoints.redelivered_through (added by " + dir + "00006_delivery_marks.up.sql)", false},
				{"catch-up table dropped", "DROP TABLE subscriber_catch_ups", "missing table subscriber_catch_ups (added by " + dir + "00006_delivery_marks.up.sql)", false},
				{"held column dropped", "DROP INDEX idx_parked_events_heads; ALTER TABLE parked_events DROP COLUMN held_by",
					"missing column parked_events.held_by (added by " + file7 + "); missing index idx_parked_events_heads (added by " + file7 + ")", false},
				// The queues' index covers aggregate_id: it goes with the column.
				{"aggregate column dropped", "DROP INDEX idx_parked_events_heads; ALTER TABLE parked_events DROP COLUMN aggregate_id",
					"missing column parked_events.aggregate_id (added by " + file2 + "); missing index idx_parked_events_heads (added by " + file7 + ")", false},
			}
			for _, c := range tampered {
				if c.postgresOnly && !b.Postgres {
					continue // SQLite cannot drop it without rebuilding the table
				}
				t.Run(c.name, func(t *testing.T) {
					db := b.Open(t)
					require.NoError(t, migrations.Migrate(ctx, db))
					for _, stmt := range strings.Split(c.change, "; ") {
						require.NoError(t, db.Exec(stmt).Error)
					}
					err := migrations.Verify(ctx, db)
					require.ErrorIs(t, err, migrations.ErrSchemaMismatch)
					require.ErrorContains(t, err, c.want)
					require.Equal(t, strings.Count(c.want, "; ")+1, strings.Count(err.Error(), "missing ")+strings.Count(err.Error(), "is not recorded"), "only the change is reported: %v", err)
				})
			}

			// A table that has the column without the record of the file
			// that adds it (an earlier build of this module added it in
			// code): Migrate completes the record instead of failing on
			// SQLite's ADD COLUMN, which cannot say IF NOT EXISTS.
			t.Run("column present, file not recorded", func(t *testing.T) {
				db := b.Open(t)
				require.NoError(t, migrations.Migrate(ctx, db))
				require.NoError(t, db.Exec("DELETE FROM "+migrations.VersionTable+" WHERE version = 2").Error)
				require.ErrorContains(t, migrations.Verify(ctx, db), "migration "+file2+" is not recorded")
				require.NoError(t, migrations.Migrate(ctx, db))
				require.NoError(t, migrations.Verify(ctx, db))
			})
		})
	}
}

// TestMigrateConcurrently: processes starting at once on an empty
// database all succeed, and the schema is created once.
func TestMigrateConcurrently(t *testing.T) {
	pg := dbtest.NewPostgres(t)
	const n = 6
	errs := make(chan error, n)
	for range n {
		db := pg.Open(t)
		go func() { errs <- migrations.Migrate(context.Background(), db) }()
	}
	for range n {
		require.NoError(t, <-errs)
	}
	require.NoError(t, migrations.Verify(testCtx(t), pg.DB))
	var versions []int64
	require.NoError(t, pg.DB.Raw("SELECT version FROM "+migrations.VersionTable+" ORDER BY version").Scan(&versions).Error)
	require.Equal(t, fileVersions(t, "postgres"), versions)
}

// TestVerifyOnlyHandle: a handle marked by VerifyOnly makes every
// constructor run no DDL, without its own option: on an empty database
// they all refuse, naming what is missing, and create nothing; the
// unmarked handle still migrates.
func TestVerifyOnlyHandle(t *testing.T) {
	for _, b := range dbtest.GormBackends() {
		t.Run(b.Name, func(t *testing.T) {
			db := b.Open(t)
			marked := migrations.VerifyOnly(db)
			_, err := infrastructure.NewGormEventStore(marked)
			require.ErrorIs(t, err, migrations.ErrSchemaMismatch)
			_, err = subscriptions.NewGormCheckpointStore(marked)
			require.ErrorIs(t, err, migrations.ErrSchemaMismatch)
			_, err = subscriptions.NewGormParkingLot(marked)
			require.ErrorIs(t, err, migrations.ErrSchemaMismatch)
			require.Empty(t, catalog(t, db), "no DDL ran")
			_, err = subscriptions.NewGormCheckpointStore(db)
			require.NoError(t, err, "the unmarked handle migrates")
			_, err = infrastructure.NewGormEventStore(marked)
			require.NoError(t, err, "and the marked one then verifies")
		})
	}
}

func catalog(t testing.TB, db *gorm.DB) []string { return dbtest.Catalog(t, db) }

// TestMigrateSchema: through one GORM handle whose search_path names
// another schema, MigrateSchema creates the module's tables in the schema
// it names (once: a second run finds the work done), VerifySchema and
// EnsureSchema then pass there, and the handle's own schema gets none; in
// a caller's transaction the search_path is left as it was. SQLite and a
// missing schema are refused.
func TestMigrateSchema(t *testing.T) {
	ctx := testCtx(t)
	pg := dbtest.NewPostgres(t)
	tenant := dbtest.NewSchema(t)
	require.ErrorIs(t, migrations.VerifySchema(ctx, pg.DB, tenant), migrations.ErrSchemaMismatch)
	require.ErrorIs(t, migrations.EnsureSchema(ctx, pg.DB, tenant, true), migrations.ErrSchemaMismatch)
	require.NoError(t, migrations.MigrateSchema(ctx, pg.DB, tenant))
	require.NoError(t, migrations.MigrateSchema(ctx, pg.DB, tenant))
	require.NoError(t, migrations.VerifySchema(ctx, pg.DB, tenant))
	require.NoError(t, migrations.EnsureSchema(ctx, migrations.VerifyOnly(pg.DB), tenant, false))
	require.Empty(t, catalog(t, pg.DB), "the handle's own schema")
	require.ErrorIs(t, migrations.Verify(ctx, pg.DB), migrations.ErrSchemaMismatch)

	require.NoError(t, pg.DB.Transaction(func(tx *gorm.DB) error {
		var before, after string
		require.NoError(t, tx.Raw("SELECT current_setting('search_path')").Scan(&before).Error)
		require.NoError(t, migrations.VerifySchema(ctx, tx, tenant))
		require.NoError(t, tx.Raw("SELECT current_setting('search_path')").Scan(&after).Error)
		require.Equal(t, before, after)
		return nil
	}))

	require.ErrorContains(t, migrations.MigrateSchema(ctx, pg.DB, pg.Schema+"_missing"), "does not exist")
	require.ErrorContains(t, migrations.MigrateSchema(ctx, dbtest.NewSQLiteMemory(t), tenant), "has no schemas")
	require.ErrorContains(t, migrations.VerifySchema(ctx, nil, tenant), "unopened")
}
