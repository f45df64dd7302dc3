package schema_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/migrations/schema"
)

// TestInSchema: one handle whose search_path names another schema
// migrates and verifies two tenant schemas (one of them with a quote and
// capitals in its name), each getting the module's tables; the handle's
// own schema gets none, and a caller's transaction keeps its search_path.
func TestInSchema(t *testing.T) {
	pg := dbtest.NewPostgres(t)
	ctx := testCtx(t)
	raw, err := pg.DB.DB()
	require.NoError(t, err)
	db := schema.SQL(raw, schema.Postgres)

	tenants := []string{pg.Schema + "_a", pg.Schema + `_B "q"`}
	for _, name := range tenants {
		require.NoError(t, db.Exec(ctx, "CREATE SCHEMA "+schema.QuoteIdent(name)))
		t.Cleanup(func() { dbtest.DropSchema(t, name) })
	}
	for _, name := range tenants {
		in, err := schema.InSchema(db, name)
		require.NoError(t, err)
		require.ErrorIs(t, schema.Verify(ctx, in), schema.ErrSchemaMismatch, "nothing there yet")
		require.NoError(t, schema.Migrate(ctx, in))
		require.NoError(t, schema.Verify(ctx, in))
		require.NoError(t, schema.Migrate(ctx, in), "a second run finds the work done")

		var n int64
		require.NoError(t, raw.QueryRowContext(ctx, "SELECT count(*) FROM "+schema.Qualified(name, "subscriber_checkpoints")).Scan(&n))
		require.Zero(t, n)
	}
	require.ErrorIs(t, schema.Verify(ctx, db), schema.ErrSchemaMismatch, "the handle's own schema got no table")

	t.Run("caller transaction keeps its search_path", func(t *testing.T) {
		tx, err := raw.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		var before, after string
		require.NoError(t, tx.QueryRowContext(ctx, "SELECT current_setting('search_path')").Scan(&before))
		in, err := schema.InSchema(txDB{schema.SQL(raw, schema.Postgres), tx}, tenants[0])
		require.NoError(t, err)
		require.NoError(t, schema.Verify(ctx, in))
		require.NoError(t, tx.QueryRowContext(ctx, "SELECT current_setting('search_path')").Scan(&after))
		require.Equal(t, before, after)
	})

	t.Run("refusals", func(t *testing.T) {
		in, err := schema.InSchema(db, pg.Schema+"_missing")
		require.NoError(t, err)
		require.ErrorContains(t, schema.Migrate(ctx, in), "does not exist")
		_, err = schema.InSchema(db, "")
		require.ErrorContains(t, err, "empty schema name")
		_, err = schema.InSchema(db, string(make([]byte, 64)))
		require.Error(t, err)
		lite, err := dbtest.NewSQLiteMemory(t).DB()
		require.NoError(t, err)
		_, err = schema.InSchema(schema.SQL(lite, schema.SQLite), "x")
		require.ErrorContains(t, err, "has no schemas")
	})
}

// txDB is a schema.DB already inside the caller's transaction tx, as
// package migrations' GORM handle is when the *gorm.DB carries one.
type txDB struct {
	schema.DB
	tx *sql.Tx
}

func (d txDB) Exec(ctx context.Context, query string, args ...any) error {
	_, err := d.tx.ExecContext(ctx, schema.Rebind(query), args...)
	return err
}

func (d txDB) Query(ctx context.Context, query string, args []any, row func(scan func(dest ...any) error) error) error {
	rows, err := d.tx.QueryContext(ctx, schema.Rebind(query), args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := row(rows.Scan); err != nil {
			return err
		}
	}
	return rows.Err()
}

func (d txDB) InTx(ctx context.Context, fn func(tx schema.DB) error) error { return fn(d) }
