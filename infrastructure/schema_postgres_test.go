package infrastructure_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/internal/feedtest"
	"github.com/eventfeed/subscriptions/internal/feedtest/pgfeed"
	"github.com/eventfeed/subscriptions/migrations"
)

// TestWithSchemaSharesTheTablesAppendLock: a store given WithSchema and
// one reaching the same events table through its pool's search_path take
// one append lock (the feed stays in order across them: the second waits
// behind the first's uncommitted append, on that lock), while a store of
// another schema on the same pool appends at once.
func TestWithSchemaSharesTheTablesAppendLock(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pg, other := dbtest.NewPostgres(t), dbtest.NewPostgres(t)
	pool := dbtest.NewPostgres(t).DB // its search_path names an empty schema
	onPath := newGormStore(t, pg.DB)
	named := newGormStore(t, pool, infrastructure.WithSchema(pg.Schema))
	otherNamed := newGormStore(t, pool, infrastructure.WithSchema(other.Schema))

	observer := pgfeed.Connect(t, pg.DSN)
	key := pgfeed.AppendLockKey(t, observer)
	require.NotEqual(t, key, pgfeed.AppendLockKey(t, pgfeed.Connect(t, other.DSN)))
	gate := pgfeed.NewGate(t, pg)

	held := newEvent("held-a", "x", nil)
	doneHeld := feedtest.Async(func() error { return onPath.Append(context.Background(), "held-a", 0, held) })
	gate.WaitHeld(t, 1)
	require.Equal(t, 1, pgfeed.AdvisoryLocks(t, observer, key, true), "the held append holds the table's lock")

	second := newEvent("b", "x", nil)
	doneSecond := feedtest.Async(func() error { return named.Append(context.Background(), "b", 0, second) })
	pgfeed.WaitForLockWaiters(t, observer, key, 1, "the WithSchema store's append")

	// Another schema's table has a lock of its own: its append is not held.
	require.NoError(t, otherNamed.Append(ctx, "c", 0, newEvent("c", "x", nil)))
	head, err := otherNamed.HeadPosition(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, head)
	feed, err := named.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	require.Empty(t, feed, "nothing is read past the uncommitted position 1")
	require.False(t, feedtest.Finished(doneSecond), "the WithSchema append waits for the search_path store's")

	gate.Release()
	require.NoError(t, feedtest.Result(t, doneHeld, "the held append"))
	require.NoError(t, feedtest.Result(t, doneSecond, "the WithSchema append"))
	for _, s := range []*infrastructure.GormEventStore{onPath, named} {
		feed, err := s.ReadAfter(ctx, 0, 0)
		require.NoError(t, err)
		require.Equal(t, []string{held.ID, second.ID}, ids(feed))
		require.Equal(t, []int64{1, 2}, positions(feed))
	}

	// One probe on the shared pool reads both tenants' heads.
	heads, err := named.ProbeHeads(ctx, []domain.EventStore{named, otherNamed, onPath})
	require.NoError(t, err)
	require.Equal(t, []int64{2, 1, 2}, heads)

	var tables int64
	require.NoError(t, pool.Raw("SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()").Scan(&tables).Error)
	require.Zero(t, tables, "the pool's own schema gets no table")
}

// TestWithSchemaRefusals: WithSchema is an error on SQLite, for a name
// Postgres or GORM cannot take exactly and for a schema that does not
// exist, never a fallback to the search_path's table; with
// WithSchemaVerifyOnly (or a migrations.VerifyOnly handle) a schema
// without the tables is ErrSchemaMismatch, and nothing is created.
func TestWithSchemaRefusals(t *testing.T) {
	t.Parallel()
	construct := func(db *gorm.DB, opts ...infrastructure.GormEventStoreOption) error {
		_, err := infrastructure.NewGormEventStore(db, opts...)
		return err
	}
	err := construct(dbtest.NewSQLiteMemory(t), infrastructure.WithSchema("tenant_1"))
	require.ErrorContains(t, err, "has no schemas")
	require.ErrorContains(t, err, "NewGormEventStore")

	pg := dbtest.NewPostgres(t)
	empty := dbtest.NewSchema(t)
	for bad, want := range map[string]string{
		"":                      "empty schema name",
		strings.Repeat("s", 64): "identifier limit",
		"a\x00b":                "NUL",
		"a?b":                   "placeholder",
		pg.Schema + "_missing":  "does not exist",
	} {
		err := construct(pg.DB, infrastructure.WithSchema(bad))
		require.ErrorContains(t, err, want, "schema %q", bad)
		require.ErrorContains(t, err, "infrastructure: NewGormEventStore", "schema %q", bad)
	}
	require.ErrorIs(t, construct(pg.DB, infrastructure.WithSchema(empty), infrastructure.WithSchemaVerifyOnly()), migrations.ErrSchemaMismatch)
	require.ErrorIs(t, construct(migrations.VerifyOnly(pg.DB), infrastructure.WithSchema(empty)), migrations.ErrSchemaMismatch)
	var n int64
	require.NoError(t, pg.DB.Raw("SELECT count(*) FROM pg_tables WHERE schemaname IN (?, ?)", empty, pg.Schema).Scan(&n).Error)
	require.Zero(t, n, "nothing was created, in the schema or on the search_path")

	// Migrated, the schema verifies.
	require.NoError(t, construct(pg.DB, infrastructure.WithSchema(empty)))
	require.NoError(t, construct(pg.DB, infrastructure.WithSchema(empty), infrastructure.WithSchemaVerifyOnly()))
}
