package pgxstore_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/migrations/schema"
	"github.com/eventfeed/subscriptions/pgxstore"
	"github.com/eventfeed/subscriptions/subscriptionstest"
)

// newLot returns a pgx parking lot on a fresh schema, with the schema's
// handles for tests that also reach it otherwise.
func newLot(t *testing.T, opts ...pgxstore.Option) (*pgxstore.ParkingLot, *dbtest.Postgres, *pgxpool.Pool) {
	t.Helper()
	pg, pool := newDatabase(t)
	lot, err := pgxstore.NewParkingLot(testCtx(t), pool, opts...)
	require.NoError(t, err)
	return lot, pg, pool
}

// inPgxTx is the suite's InTx for this package: ctx carries a usable pgx
// transaction (pgxstore.TxFromContext).
func inPgxTx(ctx context.Context) bool {
	tx := pgxstore.TxFromContext(ctx)
	if tx == nil {
		return false
	}
	var one int
	return tx.QueryRow(ctx, "SELECT 1").Scan(&one) == nil && one == 1
}

// TestParkingLotSuite runs the exported ParkingLot conformance suite
// (with its managed cases and the DeliveredClearer, PartitionDeliveredClearer
// and ParkedCounter suites) against the pgx lot, on a schema it migrates
// itself and on one goose applied from the migration files (the lot then
// built without DDL of its own).
func TestParkingLotSuite(t *testing.T) {
	t.Parallel()
	subscriptionstest.RunParkingLotSuite(t, subscriptionstest.ParkingLotHarness{
		Name:          "pgx",
		Parallel:      true,
		Transactional: true,
		InTx:          inPgxTx,
		New: func(t *testing.T) subscriptions.ParkingLot {
			lot, _, _ := newLot(t)
			return lot
		},
	})
	subscriptionstest.RunParkingLotSuite(t, subscriptionstest.ParkingLotHarness{
		Name:          "pgx-goose",
		Parallel:      true,
		Transactional: true,
		InTx:          inPgxTx,
		New: func(t *testing.T) subscriptions.ParkingLot {
			pg, pool := newDatabase(t)
			dbtest.ApplyWithGoose(t, pg.DB)
			lot, err := pgxstore.NewParkingLot(testCtx(t), pool, pgxstore.WithSchemaVerifyOnly())
			require.NoError(t, err)
			return lot
		},
	})
}

// TestNewParkingLotRefusesBadInput: a nil pool, and a schema that lacks
// the migrations under WithSchemaVerifyOnly, are errors naming the
// constructor, not panics.
func TestNewParkingLotRefusesBadInput(t *testing.T) {
	t.Parallel()
	_, err := pgxstore.NewParkingLot(testCtx(t), nil)
	require.ErrorContains(t, err, "pgxstore: NewParkingLot: nil *pgxpool.Pool")

	_, pool := newDatabase(t)
	_, err = pgxstore.NewParkingLot(testCtx(t), pool, pgxstore.WithSchemaVerifyOnly())
	require.ErrorIs(t, err, schema.ErrSchemaMismatch)
	require.ErrorContains(t, err, "pgxstore: NewParkingLot")
}
