package infrastructure_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// renamedDialector is a working SQLite dialector that reports another
// dialect's name, standing in for a driver (MySQL, say) that this module
// does not depend on.
type renamedDialector struct {
	gorm.Dialector
	name string
}

func (d renamedDialector) Name() string { return d.name }

func TestNewGormEventStoreRefusesOtherDialects(t *testing.T) {
	for _, name := range []string{"mysql", "sqlserver", "clickhouse", ""} {
		t.Run("dialect "+name, func(t *testing.T) {
			inner := sqlite.Open(dbtest.SQLiteMemoryDSN(uniqueID("renamed")))
			db, err := gorm.Open(renamedDialector{Dialector: inner, name: name}, &gorm.Config{Logger: logger.Discard})
			require.NoError(t, err)
			sqlDB, err := db.DB()
			require.NoError(t, err)
			t.Cleanup(func() { _ = sqlDB.Close() })
			require.Equal(t, name, db.Name())

			s, err := infrastructure.NewGormEventStore(db)
			require.ErrorIs(t, err, domain.ErrGlobalOrderingNotSupported)
			require.Contains(t, err.Error(), `"`+name+`"`, "the error names the dialect")
			require.Nil(t, s)

			// Nothing was created in the database.
			var tables int64
			require.NoError(t, db.Raw("SELECT COUNT(*) FROM sqlite_master WHERE name = 'events'").Scan(&tables).Error)
			require.Zero(t, tables)
		})
	}
}

func TestNewGormEventStoreNilDB(t *testing.T) {
	cases := []struct {
		name string
		db   *gorm.DB
	}{
		{"nil", nil},
		{"zero value", &gorm.DB{}},
		{"no dialector", &gorm.DB{Config: &gorm.Config{}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var s *infrastructure.GormEventStore
			var err error
			require.NotPanics(t, func() { s, err = infrastructure.NewGormEventStore(c.db) })
			require.Error(t, err)
			require.Nil(t, s)
		})
	}
}

// TestNewGormEventStoreIsIdempotent constructs the store again on a
// database that already holds events: nothing is lost, and both stores see
// the same feed.
func TestNewGormEventStoreIsIdempotent(t *testing.T) {
	for _, b := range dbtest.GormBackends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := testCtx(t)
			db := b.Open(t)
			first := newGormStore(t, db)
			require.NoError(t, first.Append(ctx, "a", 0, newEvent("a", "x", 1), newEvent("a", "x", 2)))
			for range 3 {
				again := newGormStore(t, db)
				feed, err := again.ReadAfter(ctx, 0, 0)
				require.NoError(t, err)
				require.Len(t, feed, 2)
			}
			second := newGormStore(t, db)
			require.NoError(t, second.Append(ctx, "a", 2, newEvent("a", "x", 3)))
			feed, err := first.ReadAfter(ctx, 0, 0)
			require.NoError(t, err)
			require.Equal(t, []int{1, 2, 3}, sequenceNos(feed))
			requireStrictlyIncreasing(t, feed)
		})
	}
}
