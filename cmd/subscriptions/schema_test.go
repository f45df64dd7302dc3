package main

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/migrations"
)

// schemaSnapshot is what a command must leave as it was: the catalog of
// the database's schema, the migrations it records and its checkpoints.
func schemaSnapshot(t *testing.T, db *gorm.DB) []string {
	t.Helper()
	out := dbtest.Catalog(t, db)
	var versions []string
	if slices.Contains(out, "table "+migrations.VersionTable) {
		require.NoError(t, db.Raw("SELECT CAST(version AS TEXT) FROM "+migrations.VersionTable+" ORDER BY version").Scan(&versions).Error)
	}
	var checkpoints []string
	require.NoError(t, db.Raw("SELECT subscriber || '=' || CAST(position AS TEXT) FROM subscriber_checkpoints ORDER BY subscriber").Scan(&checkpoints).Error)
	out = append(out, "recorded migrations: "+strings.Join(versions, ","), "checkpoints: "+strings.Join(checkpoints, ","))
	return out
}

// TestCommandsChangeNoSchema: on a database holding only
// subscriber_checkpoints (the original module's, say) and on one at an
// older schema version (the files up to 00003 applied, or up to 00004:
// no subscriber_pauses), every command but migrate fails, naming what is
// missing and `subscriptions migrate`, and leaves the schema exactly as
// it was (status and parked read; discard, reset, pause and resume write
// rows, never DDL); migrate -verify agrees.
// After migrate the commands work. SQLite and Postgres.
func TestCommandsChangeNoSchema(t *testing.T) {
	t.Parallel()
	cli, _ := binaries(t)
	for _, backend := range []struct {
		name string
		open func(t *testing.T) (string, *gorm.DB)
		// table is an original-module subscriber_checkpoints table.
		table string
	}{
		{"sqlite", func(t *testing.T) (string, *gorm.DB) {
			path := filepath.Join(t.TempDir(), "app.db")
			return path, dbtest.OpenSQLite(t, dbtest.SQLiteFileDSN(path))
		}, "CREATE TABLE subscriber_checkpoints (subscriber text NOT NULL PRIMARY KEY, position integer NOT NULL, updated_at datetime)"},
		{"postgres", func(t *testing.T) (string, *gorm.DB) {
			pg := dbtest.NewPostgres(t)
			return pg.DSN, pg.DB
		}, "CREATE TABLE subscriber_checkpoints (subscriber text NOT NULL PRIMARY KEY, position bigint NOT NULL, updated_at timestamptz)"},
	} {
		for _, schema := range []struct {
			name    string
			prepare func(t *testing.T, db *gorm.DB)
			missing func(dialect string) string
		}{
			{"only checkpoints", func(t *testing.T, db *gorm.DB) {
				require.NoError(t, db.Exec(backend.table).Error)
			}, func(dialect string) string {
				return "missing table events (added by " + dialect + "/00001_create_tables.up.sql)"
			}},
			{"at 00003", func(t *testing.T, db *gorm.DB) {
				dbtest.GooseUpTo(t, db, 3)
			}, func(dialect string) string {
				return "migration " + dialect + "/00004_attempt_claims.up.sql is not recorded in " + migrations.VersionTable
			}},
			// Without the table pause and resume write to.
			{"at 00004", func(t *testing.T, db *gorm.DB) {
				dbtest.GooseUpTo(t, db, 4)
			}, func(dialect string) string {
				return "missing table subscriber_pauses (added by " + dialect + "/00005_subscriber_pauses.up.sql)"
			}},
		} {
			t.Run(backend.name+"/"+schema.name, func(t *testing.T) {
				t.Parallel()
				dsn, db := backend.open(t)
				schema.prepare(t, db)
				require.NoError(t, db.Exec("INSERT INTO subscriber_checkpoints (subscriber, position) VALUES ('orders', 0)").Error)
				run := func(args ...string) result {
					return runCLI(t, cli, "", nil, append([]string{"-dsn", dsn}, args...)...)
				}
				before := schemaSnapshot(t, db)
				for _, args := range [][]string{
					{"status"},
					{"status", "-partitions"},
					{"-json", "status"},
					{"parked", "list"},
					{"parked", "list", "-subscriber", "orders"},
					{"parked", "show", "ev-1"},
					{"-yes", "parked", "discard", "ev-1"},
					{"-yes", "reset", "orders", "0"},
					{"-yes", "pause", "orders", "-reason", "x"},
					{"-yes", "resume", "orders"},
					{"migrate", "-verify"},
				} {
					r := run(args...)
					require.Equal(t, 1, r.code, "%v: stdout %s, stderr %s", args, r.stdout, r.stderr)
					require.Contains(t, r.stderr, schema.missing(db.Name()), args)
					require.Contains(t, r.stderr, "`subscriptions migrate`", args)
					require.Equal(t, before, schemaSnapshot(t, db), "%v changed the schema", args)
				}

				r := run("migrate")
				require.Equal(t, 0, r.code, r.stderr)
				r = run("migrate", "-verify")
				require.Equal(t, 0, r.code, r.stderr)
				r = run("status")
				require.Equal(t, 0, r.code, r.stderr)
				require.Regexp(t, `(?m)^orders\s+0\s+0\s+0\s+0s\s+0\s+-\s+caught up$`, r.stdout)
				r = run("parked", "list")
				require.Equal(t, 0, r.code, r.stderr)
				require.Equal(t, "no parked events\n", r.stdout)
				r = run("-yes", "reset", "orders", "0")
				require.Equal(t, 0, r.code, r.stderr)
				r = run("-yes", "pause", "orders")
				require.Equal(t, 0, r.code, r.stderr)
				r = run("-yes", "resume", "orders")
				require.Equal(t, 0, r.code, r.stderr)
			})
		}
	}
}
