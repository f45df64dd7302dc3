package migrations_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/migrations"
)

// TestExistingDatabasesAdoptTheFiles: a database the module's constructors
// created, with or without the version record (the latter as module
// versions before package migrations left it), takes the files from goose
// or Migrate without an error and without losing a row; afterwards the
// verify-only constructors accept it.
func TestExistingDatabasesAdoptTheFiles(t *testing.T) {
	appliers := []struct {
		name  string
		apply func(t *testing.T, db *gorm.DB)
	}{
		{"goose", func(t *testing.T, db *gorm.DB) {
			if db.Name() != "sqlite" {
				require.Equal(t, fileCount(t, db.Name()), dbtest.ApplyWithGoose(t, db))
				return
			}
			// SQLite has no ADD COLUMN IF NOT EXISTS: goose stops at
			// each file that adds a column the table has (00002, 00006,
			// 00007), and the remedy in docs/schema.md (record the version
			// as the file would, in goose's table too) completes it.
			for _, added := range []struct {
				version int64
				column  string
			}{{2, "aggregate_id"}, {6, "redelivered_through"}, {7, "held_by"}} {
				_, err := dbtest.GooseUp(t, db)
				require.ErrorContains(t, err, "duplicate column name: "+added.column)
				require.NoError(t, db.Exec("INSERT INTO "+migrations.VersionTable+" (version) VALUES (?) ON CONFLICT DO NOTHING", added.version).Error)
				require.NoError(t, db.Exec("INSERT INTO goose_db_version (version_id, is_applied) VALUES (?, true)", added.version).Error)
			}
			after := 0
			for _, v := range fileVersions(t, db.Name()) {
				if v > 7 {
					after++
				}
			}
			require.Equal(t, after, dbtest.ApplyWithGoose(t, db), "the files after 00007, after the remedies")
		}},
		{"Migrate", func(t *testing.T, db *gorm.DB) { require.NoError(t, migrations.Migrate(testCtx(t), db)) }},
	}
	for _, b := range dbtest.GormBackends() {
		for _, unrecorded := range []bool{false, true} {
			for _, a := range appliers {
				name := b.Name + "/recorded/" + a.name
				if unrecorded {
					name = b.Name + "/unrecorded/" + a.name
				}
				t.Run(name, func(t *testing.T) {
					ctx := testCtx(t)
					db := b.Open(t)
					store, err := infrastructure.NewGormEventStore(db)
					require.NoError(t, err)
					ev := domain.NewEventEnvelope[any](map[string]any{"kept": true}, "adopt", "adopt.test", 0)
					require.NoError(t, store.Append(ctx, "adopt", 0, ev))
					if unrecorded {
						require.NoError(t, db.Exec("DROP TABLE "+migrations.VersionTable).Error)
						_, err := infrastructure.NewGormEventStore(db, infrastructure.WithSchemaVerifyOnly())
						require.ErrorIs(t, err, migrations.ErrSchemaMismatch)
						require.ErrorContains(t, err, "missing table "+migrations.VersionTable)
					}

					a.apply(t, db)

					require.NoError(t, migrations.Verify(ctx, db))
					store, err = infrastructure.NewGormEventStore(db, infrastructure.WithSchemaVerifyOnly())
					require.NoError(t, err)
					got, err := store.GetEventByID(ctx, ev.ID)
					require.NoError(t, err)
					require.Equal(t, map[string]any{"kept": true}, got.Payload)
					require.NoError(t, store.Append(ctx, "adopt", 1, domain.NewEventEnvelope[any](nil, "adopt", "adopt.test", 0)))
					head, err := store.HeadPosition(ctx)
					require.NoError(t, err)
					require.EqualValues(t, 2, head)
				})
			}
		}
	}
}
