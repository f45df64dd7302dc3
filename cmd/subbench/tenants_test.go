package main

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/migrations"
)

// TestCloneTenants: scenario 15's one script makes, from a migrated
// template, tenant schemas the module's VerifySchema accepts (every table,
// key, index and trigger under its own name, every migration recorded),
// whose stores work (the parking lot's trigger fills its keys), and its
// drop script removes them all.
func TestCloneTenants(t *testing.T) {
	dbtest.RequirePostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang, not a speed limit
	defer cancel()
	b, err := newBench(ctx, config{DSN: dbtest.PostgresDSN()}, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, b.cleanup()) }()
	dsn, err := b.newSchema(ctx, "tenants")
	require.NoError(t, err)
	tdb, err := b.openPG(dsn, 2, nil)
	require.NoError(t, err)
	_, err = infrastructure.NewGormEventStore(tdb)
	require.NoError(t, err)

	e := &tenantEnv{b: b, sz: tenantSizes{tenants: 3}, dsn: dsn, tmpl: b.runID + "_tenants"}
	require.NoError(t, e.createTenants(ctx))
	require.Len(t, e.schemas, 3)
	for _, s := range e.schemas {
		require.NoError(t, migrations.VerifySchema(ctx, tdb, s), s)
	}
	lot, err := subscriptions.NewGormParkingLot(tdb, subscriptions.WithSchema(e.schemas[1]), subscriptions.WithSchemaVerifyOnly())
	require.NoError(t, err)
	require.NoError(t, lot.Park(ctx, subscriptions.ParkedEvent{Subscriber: "s", EventID: "e1", EventType: "t", Position: 1, Error: "x"}))
	parked, err := lot.List(ctx, "s")
	require.NoError(t, err)
	require.Len(t, parked, 1)

	require.NoError(t, e.dropTenants())
	conn, err := pgx.Connect(ctx, dbtest.PostgresDSN())
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var left int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM pg_namespace WHERE starts_with(nspname, $1)", e.tmpl+"_t").Scan(&left))
	require.Zero(t, left, "tenant schemas left after the drop script")
	require.NotContains(t, b.schemas, e.schemas[0], "dropped schemas are no longer the bench's to drop")
}
