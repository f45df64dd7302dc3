package subscriptions_test

import (
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestConstructorsNameAMissingSchema: on a Postgres connection whose
// search_path names only a schema that does not exist, every constructor
// that creates tables fails with an error that says so and names the
// search_path, instead of a driver's "converting NULL to string".
func TestConstructorsNameAMissingSchema(t *testing.T) {
	t.Parallel()
	dbtest.RequirePostgres(t)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "missing_" + hex.EncodeToString(b)
	dsn, err := dbtest.WithSearchPath(dbtest.PostgresDSN(), schema)
	require.NoError(t, err)
	db := dbtest.OpenPostgresDSN(t, dsn)

	constructors := map[string]func(*gorm.DB) error{
		"NewGormEventStore":      func(db *gorm.DB) error { _, err := infrastructure.NewGormEventStore(db); return err },
		"NewGormCheckpointStore": func(db *gorm.DB) error { _, err := subscriptions.NewGormCheckpointStore(db); return err },
		"NewGormParkingLot":      func(db *gorm.DB) error { _, err := subscriptions.NewGormParkingLot(db); return err },
	}
	for name, construct := range constructors {
		t.Run(name, func(t *testing.T) {
			err := construct(db)
			require.Error(t, err)
			require.Contains(t, err.Error(), "names no schema that exists")
			require.Contains(t, err.Error(), schema, "the error shows the search_path")
			require.NotContains(t, err.Error(), "NULL")
		})
	}
}
