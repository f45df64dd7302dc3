package pgxstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/internal/feedtest"
	"github.com/eventfeed/subscriptions/migrations/schema"
	"github.com/eventfeed/subscriptions/pgxstore"
	"github.com/eventfeed/subscriptions/subscriptionstest"
)

// foreignPool returns a pool of at most maxConns connections whose
// search_path names a schema of the test's own that holds none of the
// module's tables: on it, a statement of a WithSchema store that did not
// name its schema would fail.
func foreignPool(t *testing.T, maxConns int32) *pgxpool.Pool {
	t.Helper()
	home := dbtest.NewPostgres(t)
	cfg, err := pgxpool.ParseConfig(home.DSN)
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(testCtx(t), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// newTenantSchema creates a schema for WithSchema stores, dropped at
// cleanup. Its name needs quoting (capitals, a space, a double quote), as
// a tenant's may.
func newTenantSchema(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	name := fmt.Sprintf(`Tenant "%08x"`, rand.Uint32())
	_, err := pool.Exec(testCtx(t), "CREATE SCHEMA "+schema.QuoteIdent(name))
	require.NoError(t, err)
	t.Cleanup(func() { dbtest.DropSchema(t, name) })
	return name
}

func newSchemaCheckpointStore(t *testing.T, pool *pgxpool.Pool, name string) *pgxstore.CheckpointStore {
	t.Helper()
	s, err := pgxstore.NewCheckpointStore(testCtx(t), pool, pgxstore.WithSchema(name))
	require.NoError(t, err)
	return s
}

func newSchemaLot(t *testing.T, pool *pgxpool.Pool, name string) *pgxstore.ParkingLot {
	t.Helper()
	lot, err := pgxstore.NewParkingLot(testCtx(t), pool, pgxstore.WithSchema(name))
	require.NoError(t, err)
	return lot
}

// TestSchemaCheckpointStoreContract runs the CheckpointStore suites
// (with every capability's) against WithSchema stores on pools whose
// search_path names a schema without the module's tables; each case has
// a tenant schema of its own, the competitor's pool is another such pool.
func TestSchemaCheckpointStoreContract(t *testing.T) {
	t.Parallel()
	pool, competitorPool := foreignPool(t, 4), foreignPool(t, 4)
	subscriptionstest.RunCheckpointStoreSuite(t, subscriptionstest.CheckpointStoreHarness{
		Name:          "pgx-schema",
		Parallel:      true,
		Transactional: true,
		InTx:          inTx,
		New: func(t *testing.T) (subscriptions.CheckpointStore, subscriptions.CheckpointStore) {
			tenant := newTenantSchema(t, pool)
			return newSchemaCheckpointStore(t, pool, tenant), newSchemaCheckpointStore(t, competitorPool, tenant)
		},
	})
}

// TestSchemaParkingLotSuite runs the ParkingLot suites against WithSchema
// lots on a pool whose search_path names a schema without the module's
// tables.
func TestSchemaParkingLotSuite(t *testing.T) {
	t.Parallel()
	pool := foreignPool(t, 4)
	subscriptionstest.RunParkingLotSuite(t, subscriptionstest.ParkingLotHarness{
		Name:          "pgx-schema",
		Parallel:      true,
		Transactional: true,
		InTx:          inPgxTx,
		New: func(t *testing.T) subscriptions.ParkingLot {
			return newSchemaLot(t, pool, newTenantSchema(t, pool))
		},
	})
}

// TestSchemaTenantsShareOnePool: two tenants' stores and lots on one pool
// of two connections, with the same subscriber name, are independent:
// checkpoints, a batch in flight, resets, pauses, parked events and
// deletes of one leave the other's alone.
func TestSchemaTenantsShareOnePool(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := foreignPool(t, 2)
	type tenant struct {
		cps *pgxstore.CheckpointStore
		lot *pgxstore.ParkingLot
	}
	var a, b tenant
	for _, tn := range []*tenant{&a, &b} {
		name := newTenantSchema(t, pool)
		tn.cps, tn.lot = newSchemaCheckpointStore(t, pool, name), newSchemaLot(t, pool, name)
	}
	const sub = "orders"
	key := subscriptions.PauseKey(sub)
	advance := func(s *pgxstore.CheckpointStore, to int64) {
		t.Helper()
		batch, ok, err := s.Acquire(ctx, sub)
		require.NoError(t, err)
		require.True(t, ok)
		require.NoError(t, batch.Commit(ctx, to))
	}
	position := func(s *pgxstore.CheckpointStore) int64 {
		t.Helper()
		pos, err := s.Position(ctx, sub)
		require.NoError(t, err)
		return pos
	}
	advance(a.cps, 5)
	advance(b.cps, 9)
	require.EqualValues(t, 5, position(a.cps))
	require.EqualValues(t, 9, position(b.cps))

	// A batch in flight holds its tenant's row only: each holds one of
	// the two connections.
	held, ok, err := a.cps.Acquire(ctx, sub)
	require.NoError(t, err)
	require.True(t, ok)
	other, ok, err := b.cps.Acquire(ctx, sub)
	require.NoError(t, err)
	require.True(t, ok, "the other tenant's row of the same name is free")
	require.EqualValues(t, 9, other.Position())
	require.NoError(t, other.Commit(ctx, 10))
	_, ok, err = a.cps.Acquire(ctx, sub)
	require.NoError(t, err)
	require.False(t, ok, "the tenant's own row is held")
	require.NoError(t, held.Rollback())

	require.NoError(t, a.cps.Reset(ctx, sub, 2))
	require.EqualValues(t, 2, position(a.cps))
	require.EqualValues(t, 10, position(b.cps))

	positions, err := a.cps.Pause(ctx, key, []string{sub}, "maintenance")
	require.NoError(t, err)
	require.Equal(t, []int64{2}, positions)
	_, ok, err = a.cps.Acquire(ctx, sub)
	require.NoError(t, err)
	require.False(t, ok, "paused")
	_, paused, err := b.cps.PausedSince(ctx, key)
	require.NoError(t, err)
	require.False(t, paused, "the pause is the tenant's")
	advance(b.cps, 11)
	require.NoError(t, a.cps.Resume(ctx, key))
	advance(a.cps, 3)

	parked := subscriptions.ParkedEvent{Subscriber: sub, EventID: "ev-1", Position: 3, AggregateID: "agg-1", Error: "boom", Attempts: 2}
	require.NoError(t, a.lot.Park(ctx, parked))
	require.Equal(t, []string{"ev-1"}, listedIDs(t, a.lot, sub))
	require.Empty(t, listedIDs(t, b.lot, sub), "the other tenant's lot")
	n, err := b.lot.CountParked(ctx, sub)
	require.NoError(t, err)
	require.Zero(t, n)
	_, err = b.lot.Discard(ctx, sub, "ev-1")
	require.ErrorIs(t, err, subscriptions.ErrEventNotParked)
	replayed := 0
	require.NoError(t, a.lot.Replay(ctx, sub, "ev-1", domain.EventEnvelope[any]{ID: "ev-1"}, func(ctx context.Context, _ domain.EventEnvelope[any]) error {
		replayed++
		return nil
	}))
	require.Equal(t, 1, replayed)
	require.Empty(t, listedIDs(t, a.lot, sub))

	require.NoError(t, b.cps.Delete(ctx, sub, nil))
	require.Zero(t, position(b.cps))
	require.EqualValues(t, 3, position(a.cps))
}

// TestSchemaStoreSharesRowsWithSearchPathStore: a WithSchema store and
// lot and a search_path store and lot on the same schema, on two pools,
// see each other's rows and row locks.
func TestSchemaStoreSharesRowsWithSearchPathStore(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	tenant, onPath := newDatabase(t)
	pathStore := newCheckpointStore(t, onPath)
	pathLot, err := pgxstore.NewParkingLot(ctx, onPath)
	require.NoError(t, err)
	pool := foreignPool(t, 4)
	named, namedLot := newSchemaCheckpointStore(t, pool, tenant.Schema), newSchemaLot(t, pool, tenant.Schema)
	const sub = "shared"

	batch, ok, err := pathStore.Acquire(ctx, sub)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, batch.Commit(ctx, 4))
	batch, ok, err = named.Acquire(ctx, sub)
	require.NoError(t, err)
	require.True(t, ok)
	require.EqualValues(t, 4, batch.Position(), "the search_path store's commit")
	_, ok, err = pathStore.Acquire(ctx, sub)
	require.NoError(t, err)
	require.False(t, ok, "the WithSchema store's batch holds the same row")
	require.NoError(t, batch.Commit(ctx, 6))
	pos, err := pathStore.Position(ctx, sub)
	require.NoError(t, err)
	require.EqualValues(t, 6, pos)

	key := subscriptions.PauseKey(sub)
	_, err = named.Pause(ctx, key, []string{sub}, "shared pause")
	require.NoError(t, err)
	rec, paused, err := pathStore.PausedSince(ctx, key)
	require.NoError(t, err)
	require.True(t, paused)
	require.Equal(t, "shared pause", rec.Reason)
	require.NoError(t, pathStore.Resume(ctx, key))
	_, paused, err = named.PausedSince(ctx, key)
	require.NoError(t, err)
	require.False(t, paused)

	head := subscriptions.ParkedEvent{Subscriber: sub, EventID: "ev-1", Position: 7, AggregateID: "agg", Error: "boom", Attempts: 1}
	require.NoError(t, pathLot.Park(ctx, head))
	behind := head
	behind.EventID, behind.Position = "ev-2", 8
	heldBy, err := namedLot.Hold(ctx, behind)
	require.NoError(t, err)
	require.Equal(t, "ev-1", heldBy, "held behind the head the search_path lot parked")
	got, err := pathLot.Get(ctx, sub, "ev-2")
	require.NoError(t, err)
	require.Equal(t, "ev-1", got.HeldBy)
	require.NoError(t, pathLot.Replay(ctx, sub, "ev-1", domain.EventEnvelope[any]{ID: "ev-1"}, func(context.Context, domain.EventEnvelope[any]) error { return nil }))
	heads, err := namedLot.ParkedHeads(ctx, sub)
	require.NoError(t, err)
	require.Len(t, heads, 1)
	require.Equal(t, "ev-2", heads[0].EventID, "the replay promoted the next entry")
}

// TestSchemaStoreReadsItsSchemasFeed: a WithSchema checkpoint store reads
// its own schema's events, not those of the pool's search_path, though
// that schema has events at the same positions: AcquireAfter (with and
// without a limit), a batch's ReadPositions and a repartition's read; and
// an EventStore on the same pool but another schema is not its feed.
func TestSchemaStoreReadsItsSchemasFeed(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	tenant, onTenant := newDatabase(t)
	home, pool := newDatabase(t)
	tenantEvents, err := pgxstore.NewEventStore(ctx, onTenant)
	require.NoError(t, err)
	homeEvents, err := pgxstore.NewEventStore(ctx, pool)
	require.NoError(t, err)
	var want []string
	for i := range 3 {
		ev := feedtest.NewEvent("tenant-agg", "feed.tenant", i+1)
		require.NoError(t, tenantEvents.Append(ctx, "tenant-agg", i, ev))
		want = append(want, ev.ID)
	}
	for i := range 3 {
		require.NoError(t, homeEvents.Append(ctx, "home-agg", i, feedtest.NewEvent("home-agg", "feed.home", i+1)))
	}
	cps := newSchemaCheckpointStore(t, pool, tenant.Schema)
	require.False(t, cps.SharesFeed(homeEvents), "an event store of schema %s on the same pool is another tenant's feed", home.Schema)
	require.True(t, newCheckpointStore(t, pool).SharesFeed(homeEvents), "the search_path store's feed")

	require.NoError(t, cps.Reset(ctx, "reader", 0)) // AcquireAfter declines a missing row
	batch, events, ok, err := cps.AcquireAfter(ctx, "reader", 0, 0)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, want, eventIDs(events))
	got, err := batch.(subscriptions.BatchFeedReader).ReadPositions(ctx, []int64{events[2].Position, events[0].Position})
	require.NoError(t, err)
	require.Equal(t, []string{want[0], want[2]}, eventIDs(got))
	require.NoError(t, batch.Rollback())
	batch, events, ok, err = cps.AcquireAfter(ctx, "reader", 0, 2)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, want[:2], eventIDs(events))
	require.NoError(t, batch.Rollback())

	stop := errors.New("read, nothing to write")
	err = cps.Repartition(ctx, "reader/partitions", []string{"reader"}, []string{"reader/partition-0-of-2", "reader/partition-1-of-2"}, 2,
		func(ctx context.Context, _ subscriptions.RepartitionRows, read subscriptions.RepartitionFeed) (int64, func(context.Context) error, error) {
			got, err := read(ctx, 1, 3, 10)
			require.NoError(t, err)
			require.Equal(t, want[1:], eventIDs(got))
			return 0, nil, stop
		})
	require.ErrorIs(t, err, stop)
}

func eventIDs(events []domain.EventEnvelope[any]) []string {
	out := make([]string, len(events))
	for i, ev := range events {
		out[i] = ev.ID
	}
	return out
}

// TestWithSchemaRefusals: a schema name Postgres could not name exactly,
// and a schema that does not exist, are errors of every constructor
// that names it (with WithSchemaVerifyOnly too), not a fallback to the
// search_path's tables; a schema without the migrations is
// ErrSchemaMismatch under WithSchemaVerifyOnly.
func TestWithSchemaRefusals(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := foreignPool(t, 2)
	empty := newTenantSchema(t, pool)
	constructors := map[string]func(opts ...pgxstore.Option) error{
		"NewCheckpointStore": func(opts ...pgxstore.Option) error {
			_, err := pgxstore.NewCheckpointStore(ctx, pool, opts...)
			return err
		},
		"NewParkingLot": func(opts ...pgxstore.Option) error {
			_, err := pgxstore.NewParkingLot(ctx, pool, opts...)
			return err
		},
		"NewEventStore": func(opts ...pgxstore.Option) error {
			_, err := pgxstore.NewEventStore(ctx, pool, opts...)
			return err
		},
	}
	for name, build := range constructors {
		for _, bad := range []struct{ schema, says string }{
			{"", "WithSchema: empty schema name"},
			{strings.Repeat("s", schema.MaxSchemaBytes+1), "longer than Postgres's 63-byte identifier limit"},
			{"nul\x00byte", "contains a NUL byte"},
		} {
			for _, opts := range [][]pgxstore.Option{{pgxstore.WithSchema(bad.schema)}, {pgxstore.WithSchema(bad.schema), pgxstore.WithSchemaVerifyOnly()}} {
				err := build(opts...)
				require.ErrorContains(t, err, "pgxstore: "+name+": ", "%q", bad.schema)
				require.ErrorContains(t, err, bad.says, "%q", bad.schema)
			}
		}
		for _, opts := range [][]pgxstore.Option{{pgxstore.WithSchema("no such schema")}, {pgxstore.WithSchema("no such schema"), pgxstore.WithSchemaVerifyOnly()}} {
			err := build(opts...)
			require.ErrorContains(t, err, "pgxstore: "+name+": ")
			require.ErrorContains(t, err, `schema "no such schema" does not exist`)
		}
		err := build(pgxstore.WithSchema(empty), pgxstore.WithSchemaVerifyOnly())
		require.ErrorIs(t, err, schema.ErrSchemaMismatch, "%s on a schema without the tables", name)
	}
	var exists bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass('subscriber_checkpoints') IS NOT NULL").Scan(&exists))
	require.False(t, exists, "nothing was created on the search_path")
	require.NoError(t, pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'no such schema')").Scan(&exists))
	require.False(t, exists, "no schema was created")
}

// TestSchemaEventStoreSuite runs the EventStore suite against WithSchema
// stores on a pool whose search_path names a schema without the module's
// tables, each case in a tenant schema of its own.
func TestSchemaEventStoreSuite(t *testing.T) {
	t.Parallel()
	pool := foreignPool(t, 4)
	subscriptionstest.RunEventStoreSuite(t, subscriptionstest.EventStoreHarness{
		Name:     "pgx-schema",
		Parallel: true,
		New: func(t *testing.T) domain.EventStore {
			s, err := pgxstore.NewEventStore(testCtx(t), pool, pgxstore.WithSchema(newTenantSchema(t, pool)))
			require.NoError(t, err)
			return s
		},
		MaxIdentifierBytes: pgxstore.MaxIdentifierBytes,
	})
}

// TestSchemaFeedSharerContract runs the FeedSharer suite on one pool of
// tenants: a WithSchema checkpoint store shares the feed of the event
// store of its schema, not that of another tenant's schema on the pool.
func TestSchemaFeedSharerContract(t *testing.T) {
	pool := foreignPool(t, 4)
	subscriptionstest.RunFeedSharerSuite(t, subscriptionstest.FeedSharerHarness{
		Name: "pgx-schema",
		New: func(t *testing.T) (subscriptions.CheckpointStore, domain.EventStore, domain.EventStore) {
			own, other := newTenantSchema(t, pool), newTenantSchema(t, pool)
			shared, err := pgxstore.NewEventStore(testCtx(t), pool, pgxstore.WithSchema(own))
			require.NoError(t, err)
			foreign, err := pgxstore.NewEventStore(testCtx(t), pool, pgxstore.WithSchema(other))
			require.NoError(t, err)
			return newSchemaCheckpointStore(t, pool, own), shared, foreign
		},
	})
}
