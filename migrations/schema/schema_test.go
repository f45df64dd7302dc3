package schema_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/migrations/schema"
)

func TestMain(m *testing.M) { dbtest.VerifyTestMain(m) }

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestStatements: the splitter runs files the way goose does: the Up
// section only, a statement per semicolon-terminated run of lines,
// StatementBegin/End blocks whole, comment lines dropped.
func TestStatements(t *testing.T) {
	cases := []struct {
		name string
		sql  string
		want []string
	}{
		{"plain", "-- +goose Up\nCREATE TABLE a (x int);\nCREATE INDEX i ON a (x);\n", []string{"CREATE TABLE a (x int);", "CREATE INDEX i ON a (x);"}},
		{"multi-line with comments", "-- +goose Up\n-- a comment\nCREATE TABLE a (\n\tx int, -- trailing\n\ty int\n);\n\n-- another\nINSERT INTO a VALUES (1, 2);\n",
			[]string{"CREATE TABLE a (\n\tx int, -- trailing\n\ty int\n);", "INSERT INTO a VALUES (1, 2);"}},
		{"block", "-- +goose Up\n-- +goose StatementBegin\nDO $$ BEGIN\n  PERFORM 1;\nEND $$;\n-- +goose StatementEnd\nSELECT 1;\n",
			[]string{"DO $$ BEGIN\n  PERFORM 1;\nEND $$;", "SELECT 1;"}},
		{"down section ignored", "-- +goose Up\nSELECT 1;\n-- +goose Down\nDROP TABLE a;\n", []string{"SELECT 1;"}},
		{"no trailing semicolon", "-- +goose Up\nSELECT 1", []string{"SELECT 1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, schema.StatementsForTest(c.sql))
		})
	}
}

// TestFilesAreToolReadable: every file is NNNNN_name.up.sql with goose's
// Up annotation first (goose, golang-migrate and atlas read that), ends by
// recording its own version, and the two engines have the same versions.
func TestFilesAreToolReadable(t *testing.T) {
	pgVersions, pgNames, pgBodies, err := schema.FilesForTest("postgres")
	require.NoError(t, err)
	liteVersions, liteNames, liteBodies, err := schema.FilesForTest("sqlite")
	require.NoError(t, err)
	require.Equal(t, pgVersions, liteVersions, "both engines have the same migrations")
	require.Equal(t, pgNames, liteNames)
	for i, v := range pgVersions {
		// Versions increase; a gap is allowed (numbers are given out to
		// work in progress on other branches), and load refuses duplicates.
		if i > 0 {
			require.Greater(t, v, pgVersions[i-1], "versions increase")
		}
		for _, body := range []string{pgBodies[i], liteBodies[i]} {
			require.Regexp(t, `^\d{5}_[a-z0-9_]+\.up\.sql$`, pgNames[i])
			require.True(t, strings.HasPrefix(body, "-- +goose Up\n"), "%s starts with the goose annotation", pgNames[i])
			stmts := schema.StatementsForTest(body)
			for _, stmt := range stmts {
				// package migrations runs statements through GORM, which reads ?
				// and @name as placeholders.
				require.NotContains(t, stmt, "?", "%s: a ? would be taken for a placeholder", pgNames[i])
				require.NotRegexp(t, `@[A-Za-z_]`, stmt, "%s: an @name would be taken for a placeholder", pgNames[i])
			}
			require.Equal(t, fmt.Sprintf("INSERT INTO %s (version) VALUES (%d) ON CONFLICT DO NOTHING;", schema.VersionTable, v),
				stmts[len(stmts)-1], "%s records its version last", pgNames[i])
		}
	}
	_, err = schema.Dir("mysql")
	require.Error(t, err)
}

func catalog(t testing.TB, db *gorm.DB) []string { return dbtest.Catalog(t, db) }

// TestManifestMatchesFiles: applying the files one at a time to an empty
// database, each creates exactly the objects Verify expects of it, no
// more, no fewer: Verify's list and the files cannot drift apart.
func TestManifestMatchesFiles(t *testing.T) {
	for _, b := range dbtest.GormBackends() {
		t.Run(b.Name, func(t *testing.T) {
			db := b.Open(t)
			require.Empty(t, catalog(t, db))
			versions, names, bodies, err := schema.FilesForTest(db.Name())
			require.NoError(t, err)
			manifest := schema.ManifestForTest(db.Name())
			var want []string
			for i, v := range versions {
				for _, stmt := range schema.StatementsForTest(bodies[i]) {
					require.NoError(t, db.Exec(stmt).Error, "%s: %s", names[i], stmt)
				}
				_, listed := manifest[v]
				require.True(t, listed, "%s has no manifest entry", names[i])
				want = append(want, manifest[v]...)
				require.ElementsMatch(t, want, catalog(t, db), "after %s", names[i])
			}
			require.Len(t, manifest, len(versions), "a manifest entry without a file")
		})
	}
}

// TestSQLAdapter: Migrate and Verify through a plain *sql.DB (SQL), as a
// backend without GORM runs them: Verify names what is missing before,
// passes after, and a second Migrate changes nothing.
func TestSQLAdapter(t *testing.T) {
	for _, b := range dbtest.GormBackends() {
		t.Run(b.Name, func(t *testing.T) {
			g := b.Open(t)
			pool, err := g.DB()
			require.NoError(t, err)
			db := schema.SQL(pool, g.Name())
			ctx := testCtx(t)
			require.ErrorIs(t, schema.Verify(ctx, db), schema.ErrSchemaMismatch)
			require.NoError(t, schema.Migrate(ctx, db))
			require.NoError(t, schema.Verify(ctx, db))
			before := catalog(t, g)
			require.NoError(t, schema.Migrate(ctx, db))
			require.Equal(t, before, catalog(t, g))
		})
	}
	require.ErrorContains(t, schema.Migrate(context.Background(), nil), "nil handle")
	require.ErrorContains(t, schema.Verify(context.Background(), nil), "nil handle")
}

// TestRebind: ? becomes $n outside quotes only.
func TestRebind(t *testing.T) {
	require.Equal(t, "SELECT $1, '?', \"a?\", $2", schema.Rebind(`SELECT ?, '?', "a?", ?`))
	require.Equal(t, "SELECT 1", schema.Rebind("SELECT 1"))
}

// TestLockKey: keys are stable (backends on one database must agree) and
// differ by purpose and name.
func TestLockKey(t *testing.T) {
	require.Equal(t, schema.LockKey("append", `"s".events`), schema.LockKey("append", `"s".events`))
	require.NotEqual(t, schema.LockKey("append", "a"), schema.LockKey("migrate", "a"))
	require.NotEqual(t, schema.LockKey("append", "a"), schema.LockKey("append", "b"))
}
