package subscriptions_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/schema"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestGormCheckpointModelMatchesMigratedTable: GormCheckpointModel is the
// one description of subscriber_checkpoints besides the migration files
// that create it. Each column of the migrated table has a field of the
// same name, the type the dialect gives that field, the same nullability
// and the same primary key, and the model has no other field: a migration
// or a tag that changes one without the other fails here.
func TestGormCheckpointModelMatchesMigratedTable(t *testing.T) {
	t.Parallel()
	for _, b := range dbtest.GormBackends() {
		t.Run(b.Name, func(t *testing.T) {
			db := b.Open(t)
			_, err := subscriptions.NewGormCheckpointStore(db) // runs the migrations
			require.NoError(t, err)

			model := &subscriptions.GormCheckpointModel{}
			stmt := db.Session(&gorm.Session{}).Statement
			require.NoError(t, stmt.Parse(model))
			fields := map[string]*schema.Field{}
			for _, f := range stmt.Schema.Fields {
				if f.DBName != "" {
					fields[f.DBName] = f
				}
			}

			columns, err := db.Migrator().ColumnTypes(model)
			require.NoError(t, err)
			require.NotEmpty(t, columns, "subscriber_checkpoints has no columns")
			seen := map[string]bool{}
			for _, c := range columns {
				seen[c.Name()] = true
				f, ok := fields[c.Name()]
				require.True(t, ok, "column %s of the migrated table has no field in GormCheckpointModel", c.Name())
				require.Equal(t, normalType(db.Dialector.DataTypeOf(f)), normalType(c.DatabaseTypeName()),
					"column %s: the model's type (as the dialect maps field %s) differs from the migrated column", c.Name(), f.Name)
				var pk, notNull bool
				if b.Postgres {
					var pkOK, nullOK, nullable bool
					pk, pkOK = c.PrimaryKey()
					nullable, nullOK = c.Nullable()
					require.True(t, pkOK && nullOK, "column %s: the driver does not report the key or nullability", c.Name())
					notNull = !nullable
				} else {
					// The SQLite migrators do not report the key, and report
					// this NOT NULL column as nullable: ask SQLite's catalogue.
					info := sqliteColumnInfo(t, db, c.Name())
					pk, notNull = info.PK > 0, info.NotNull != 0
				}
				require.Equal(t, f.PrimaryKey, pk, "column %s: primary key", c.Name())
				require.Equal(t, f.NotNull || f.PrimaryKey, notNull, "column %s: NOT NULL", c.Name())
			}
			for name, f := range fields {
				require.True(t, seen[name], "field %s of GormCheckpointModel has no column %s in the migrated table", f.Name, name)
			}
		})
	}
}

// sqliteColumnInfo is SQLite's own description of a column of
// subscriber_checkpoints (PRAGMA table_info); it fails the test on another
// engine.
func sqliteColumnInfo(t *testing.T, db *gorm.DB, column string) (info struct {
	PK      int
	NotNull int
}) {
	t.Helper()
	require.NoError(t, db.Raw(`SELECT pk, "notnull" AS not_null FROM pragma_table_info('subscriber_checkpoints') WHERE name = ?`, column).Scan(&info).Error)
	return info
}

// normalType folds the spellings of one SQL type: what a dialect writes
// in DDL and what the catalogue reports back (Postgres reports bigint as
// int8 and timestamptz as "timestamp with time zone").
func normalType(t string) string {
	t = strings.ToLower(strings.TrimSpace(t))
	switch t {
	case "int8":
		return "bigint"
	case "timestamp with time zone", "timestamptz":
		return "timestamptz"
	}
	return t
}
