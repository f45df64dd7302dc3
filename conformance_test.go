package subscriptions_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/subscriptionstest"
)

// TestParkingLotSuite runs the exported ParkingLot conformance suite
// against MemoryParkingLot and GormParkingLot on every database (with
// WithSchema too: gormStoreBackends), and on schemas goose applied from
// migrations.FS (the lot then built without DDL of its own).
func TestParkingLotSuite(t *testing.T) {
	t.Parallel()
	subscriptionstest.RunParkingLotSuite(t, subscriptionstest.ParkingLotHarness{
		Name:     "memory",
		Parallel: true,
		New:      func(*testing.T) subscriptions.ParkingLot { return subscriptions.NewMemoryParkingLot() },
	})
	for _, b := range gormStoreBackends() {
		subscriptionstest.RunParkingLotSuite(t, subscriptionstest.ParkingLotHarness{
			Name:          b.Name,
			Parallel:      true,
			Transactional: true,
			New: func(t *testing.T) subscriptions.ParkingLot {
				db := openStoreDB(t, b)
				lot, err := subscriptions.NewGormParkingLot(db.DB, db.Opts...)
				require.NoError(t, err)
				return lot
			},
		})
	}
	for _, b := range dbtest.GooseBackends() {
		subscriptionstest.RunParkingLotSuite(t, subscriptionstest.ParkingLotHarness{
			Name:          b.Name,
			Parallel:      true,
			Transactional: true,
			New: func(t *testing.T) subscriptions.ParkingLot {
				lot, err := subscriptions.NewGormParkingLot(b.Open(t), subscriptions.WithSchemaVerifyOnly())
				require.NoError(t, err)
				return lot
			},
		})
	}
}
