package subscriptions_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/migrations"
	"github.com/eventfeed/subscriptions/migrations/schema"
)

// gormStoreBackends are the databases the suites of GormCheckpointStore and
// GormParkingLot run on: dbtest's GORM backends and its tenant backend,
// whose stores reach their tables through WithSchema on a pool whose
// search_path names another, empty schema. Only those suites take the
// tenant backend: the stores that take WithSchema are theirs.
func gormStoreBackends() []dbtest.Backend {
	return append(dbtest.GormBackends(), dbtest.TenantBackend())
}

// storeDB is one test's database for the GORM stores: the pool, a second
// pool on the same tables (Postgres; as another process's), and the
// options that select the tables.
type storeDB struct {
	DB     *gorm.DB
	Reopen func(t testing.TB) *gorm.DB // nil on SQLite
	Opts   []subscriptions.GormStoreOption
}

// openStoreDB opens b's database for one test.
func openStoreDB(t *testing.T, b dbtest.Backend) storeDB {
	t.Helper()
	switch {
	case b.Tenant:
		tn := dbtest.NewTenant(t)
		return storeDB{DB: tn.DB, Reopen: tn.Open, Opts: []subscriptions.GormStoreOption{subscriptions.WithSchema(tn.Schema)}}
	case b.Postgres:
		pg := dbtest.NewPostgres(t)
		return storeDB{DB: pg.DB, Reopen: pg.Open}
	}
	return storeDB{DB: b.Open(t)}
}

// TestGormStoresShareOnePoolAcrossSchemas: two tenants' checkpoint stores
// and parking lots on one pool of two connections, each given its schema
// (WithSchema), are independent: a checkpoint, a held row, a parked
// event, a reset, a delete and a pause of one tenant are invisible in the
// other; the pool's own schema gets no table. A store opened through a
// search_path naming a tenant's schema, as before WithSchema, sees the
// same rows as that tenant's store and contends for the same row locks.
// A tenant's store shares no feed with an event store of another schema.
func TestGormStoresShareOnePoolAcrossSchemas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := dbtest.NewPostgres(t)
	raw, err := pg.DB.DB()
	require.NoError(t, err)
	raw.SetMaxOpenConns(2)

	type tenant struct {
		name string
		cps  *subscriptions.GormCheckpointStore
		lot  *subscriptions.GormParkingLot
	}
	open := func(db *gorm.DB, name string, opts ...subscriptions.GormStoreOption) tenant {
		cps, err := subscriptions.NewGormCheckpointStore(db, opts...)
		require.NoError(t, err)
		lot, err := subscriptions.NewGormParkingLot(db, opts...)
		require.NoError(t, err)
		return tenant{name: name, cps: cps, lot: lot}
	}
	var tenants []tenant
	for range 2 {
		name := dbtest.NewSchema(t)
		tenants = append(tenants, open(pg.DB, name, subscriptions.WithSchema(name)))
	}
	a, b := tenants[0], tenants[1]
	position := func(tn tenant, sub string) int64 {
		t.Helper()
		pos, err := tn.cps.Position(ctx, sub)
		require.NoError(t, err)
		return pos
	}
	parked := func(tn tenant, sub string) []string {
		t.Helper()
		list, err := tn.lot.List(ctx, sub)
		require.NoError(t, err)
		ids := make([]string, 0, len(list))
		for _, p := range list {
			ids = append(ids, p.EventID)
		}
		return ids
	}
	const sub = "projector"

	t.Run("checkpoints", func(t *testing.T) {
		coreAdvance(t, a.cps, sub, 5)
		require.EqualValues(t, 0, position(b, sub))
		coreAdvance(t, b.cps, sub, 9)
		require.EqualValues(t, 5, position(a, sub))

		// A's batch holds A's row only: B's batch of the same name runs
		// beside it, the two holding the pool's two connections.
		held, ok, err := a.cps.Acquire(ctx, sub)
		require.NoError(t, err)
		require.True(t, ok)
		other, ok, err := b.cps.Acquire(ctx, sub)
		require.NoError(t, err)
		require.True(t, ok, "tenant B's row is not tenant A's")
		require.NoError(t, other.Commit(ctx, 10))
		require.NoError(t, held.Rollback())
		require.EqualValues(t, 5, position(a, sub))
		require.EqualValues(t, 10, position(b, sub))
	})

	t.Run("parked events", func(t *testing.T) {
		// Parked through A's batch: committed with A's checkpoint.
		batch, ok, err := a.cps.Acquire(ctx, sub)
		require.NoError(t, err)
		require.True(t, ok)
		require.NoError(t, a.lot.Park(batch.HandlerContext(ctx), subscriptions.ParkedEvent{Subscriber: sub, EventID: "ev-6", Position: 6, Error: "poison"}))
		require.NoError(t, batch.Commit(ctx, 6))
		require.Equal(t, []string{"ev-6"}, parked(a, sub))
		require.Empty(t, parked(b, sub))
		n, err := b.lot.CountParked(ctx, sub)
		require.NoError(t, err)
		require.Zero(t, n)

		require.NoError(t, b.lot.Park(ctx, subscriptions.ParkedEvent{Subscriber: sub, EventID: "ev-11", Position: 11, Error: "poison"}))
		require.NoError(t, a.lot.Purge(ctx, sub))
		require.Empty(t, parked(a, sub))
		require.Equal(t, []string{"ev-11"}, parked(b, sub))
	})

	t.Run("resets, deletes and pauses", func(t *testing.T) {
		require.NoError(t, a.cps.Reset(ctx, sub, 2))
		require.EqualValues(t, 2, position(a, sub))
		require.EqualValues(t, 10, position(b, sub))

		_, err := a.cps.Pause(ctx, subscriptions.PauseKey(sub), []string{sub}, "maintenance")
		require.NoError(t, err)
		_, paused, err := b.cps.PausedSince(ctx, subscriptions.PauseKey(sub))
		require.NoError(t, err)
		require.False(t, paused, "tenant A's pause is not tenant B's")
		batch, ok, err := b.cps.Acquire(ctx, sub)
		require.NoError(t, err)
		require.True(t, ok)
		require.NoError(t, batch.Rollback())
		require.NoError(t, a.cps.Resume(ctx, subscriptions.PauseKey(sub)))

		require.NoError(t, a.cps.Delete(ctx, sub, nil))
		require.EqualValues(t, 0, position(a, sub))
		require.EqualValues(t, 10, position(b, sub))
	})

	t.Run("the pool's own schema gets no table", func(t *testing.T) {
		var n int64
		require.NoError(t, pg.DB.Raw("SELECT count(*) FROM pg_tables WHERE schemaname = ?", pg.Schema).Scan(&n).Error)
		require.Zero(t, n)
		require.LessOrEqual(t, raw.Stats().OpenConnections, 2)
	})

	t.Run("a store through the search_path sees the same rows", func(t *testing.T) {
		dsn, err := dbtest.WithSearchPath(dbtest.PostgresDSN(), schema.QuoteIdent(b.name))
		require.NoError(t, err)
		direct := open(dbtest.OpenPostgresDSN(t, dsn), b.name)
		require.EqualValues(t, 10, position(direct, sub))
		require.Equal(t, []string{"ev-11"}, parked(direct, sub))

		coreAdvance(t, direct.cps, sub, 12)
		require.EqualValues(t, 12, position(b, sub))
		require.NoError(t, direct.lot.Park(ctx, subscriptions.ParkedEvent{Subscriber: sub, EventID: "ev-13", Position: 13, Error: "poison"}))
		require.Equal(t, []string{"ev-11", "ev-13"}, parked(b, sub))

		held, ok, err := b.cps.Acquire(ctx, sub)
		require.NoError(t, err)
		require.True(t, ok)
		_, ok, err = direct.cps.Acquire(ctx, sub)
		require.NoError(t, err)
		require.False(t, ok, "one row, one lock: the batch of the schema-qualified store holds it")
		require.NoError(t, held.Rollback())
		require.Empty(t, parked(a, sub))
	})

	t.Run("a feed is shared within its schema only", func(t *testing.T) {
		// An event store on the pool reads the search_path's events
		// table; a tenant's batches read their schema's.
		events, err := infrastructure.NewGormEventStore(pg.DB)
		require.NoError(t, err)
		require.False(t, a.cps.SharesFeed(events))
		plain := open(pg.DB, "")
		require.True(t, plain.cps.SharesFeed(events))
		// An event store given a tenant's schema is that tenant's feed.
		eventsA, err := infrastructure.NewGormEventStore(pg.DB, infrastructure.WithSchema(a.name))
		require.NoError(t, err)
		require.True(t, a.cps.SharesFeed(eventsA))
		require.False(t, b.cps.SharesFeed(eventsA), "another tenant's schema")
		require.False(t, plain.cps.SharesFeed(eventsA), "the search_path's tables")
	})
}

// TestGormTenantsRunOnOnePool: two tenants' event stores, checkpoint
// stores and parking lots on one pool of two connections, each given its
// schema (both WithSchema options), run a subscriber of the same name to
// completion each, independently: each handles its own tenant's events,
// exactly once and in order, in the batch's transaction (the shared feed
// of its schema), never the other's.
func TestGormTenantsRunOnOnePool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := dbtest.NewPostgres(t)
	raw, err := pg.DB.DB()
	require.NoError(t, err)
	raw.SetMaxOpenConns(2)

	type tenant struct {
		events *infrastructure.GormEventStore
		cps    *subscriptions.GormCheckpointStore
		rec    *coreRecorder
		want   []string
	}
	tenants := make([]*tenant, 2)
	for i := range tenants {
		name := dbtest.NewSchema(t)
		events, err := infrastructure.NewGormEventStore(pg.DB, infrastructure.WithSchema(name))
		require.NoError(t, err)
		cps, err := subscriptions.NewGormCheckpointStore(pg.DB, subscriptions.WithSchema(name))
		require.NoError(t, err)
		lot, err := subscriptions.NewGormParkingLot(pg.DB, subscriptions.WithSchema(name))
		require.NoError(t, err)
		require.True(t, cps.SharesFeed(events))
		tn := &tenant{events: events, cps: cps, rec: &coreRecorder{}}
		tn.want = appendN(t, events, fmt.Sprintf("tenant%d.happened", i), 0, 12+5*i)
		sub := coreNewSub(t, "projector", events, cps, func(ctx context.Context, ev domain.EventEnvelope[any]) error {
			tn.rec.record(ctx, ev)
			return nil
		}, subscriptions.WithParkingLot(lot), subscriptions.WithBatchSize(5))
		start(t, sub)
		tenants[i] = tn
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		pos, err := sub.WaitCaughtUp(wctx)
		cancel()
		require.NoError(t, err)
		require.EqualValues(t, len(tn.want), pos)
	}
	for i, tn := range tenants {
		require.Equal(t, tn.want, tn.rec.ids(), "tenant %d handled its own events, once, in order", i)
		for _, inTx := range tn.rec.txSeen() {
			require.True(t, inTx, "tenant %d: handled in the batch's transaction", i)
		}
		pos, err := tn.cps.Position(ctx, "projector")
		require.NoError(t, err)
		require.EqualValues(t, len(tn.want), pos)
	}
	require.NotEqual(t, len(tenants[0].want), len(tenants[1].want), "the tenants' feeds differ")
	require.LessOrEqual(t, raw.Stats().OpenConnections, 2)
	var n int64
	require.NoError(t, pg.DB.Raw("SELECT count(*) FROM pg_tables WHERE schemaname = ?", pg.Schema).Scan(&n).Error)
	require.Zero(t, n, "the pool's own schema gets no table")
}

// TestWithSchemaRefusals: WithSchema is an error on SQLite (no schemas),
// for a name Postgres or GORM cannot take exactly, and for a schema that
// does not exist; with WithSchemaVerifyOnly (or a migrations.VerifyOnly
// handle) a schema without the tables is ErrSchemaMismatch, and nothing is
// created in it.
func TestWithSchemaRefusals(t *testing.T) {
	t.Parallel()
	constructors := map[string]func(*gorm.DB, ...subscriptions.GormStoreOption) error{
		"NewGormCheckpointStore": func(db *gorm.DB, opts ...subscriptions.GormStoreOption) error {
			_, err := subscriptions.NewGormCheckpointStore(db, opts...)
			return err
		},
		"NewGormParkingLot": func(db *gorm.DB, opts ...subscriptions.GormStoreOption) error {
			_, err := subscriptions.NewGormParkingLot(db, opts...)
			return err
		},
	}
	lite := dbtest.NewSQLiteMemory(t)
	pg := dbtest.NewPostgres(t)
	empty := dbtest.NewSchema(t)
	for name, construct := range constructors {
		t.Run(name, func(t *testing.T) {
			err := construct(lite, subscriptions.WithSchema("tenant_1"))
			require.ErrorContains(t, err, "has no schemas")
			require.ErrorContains(t, err, name)

			for bad, want := range map[string]string{
				"":                      "empty schema name",
				strings.Repeat("s", 64): "identifier limit",
				"a\x00b":                "NUL",
				"a?b":                   "placeholder",
				pg.Schema + "_missing":  "does not exist",
			} {
				require.ErrorContains(t, construct(pg.DB, subscriptions.WithSchema(bad)), want, "schema %q", bad)
			}

			require.ErrorIs(t, construct(pg.DB, subscriptions.WithSchema(empty), subscriptions.WithSchemaVerifyOnly()), migrations.ErrSchemaMismatch)
			require.ErrorIs(t, construct(migrations.VerifyOnly(pg.DB), subscriptions.WithSchema(empty)), migrations.ErrSchemaMismatch)
			var n int64
			require.NoError(t, pg.DB.Raw("SELECT count(*) FROM pg_tables WHERE schemaname = ?", empty).Scan(&n).Error)
			require.Zero(t, n, "verifying creates nothing")
		})
	}
}
