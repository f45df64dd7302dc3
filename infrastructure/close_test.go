package infrastructure_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestMemoryStoreClose: after Close every call fails.
func TestMemoryStoreClose(t *testing.T) {
	ctx := testCtx(t)
	s := infrastructure.NewMemoryStore()
	require.NoError(t, s.Append(ctx, "a", 0, newEvent("a", "x", nil)))
	require.NoError(t, s.Close())
	calls := map[string]func() error{
		"Append":    func() error { return s.Append(ctx, "a", -1, newEvent("a", "x", nil)) },
		"GetEvents": func() error { _, err := s.GetEvents(ctx, "a"); return err },
		"GetEventByID": func() error {
			_, err := s.GetEventByID(ctx, "id")
			return err
		},
		"GetEventsByTransactionID": func() error { _, err := s.GetEventsByTransactionID(ctx, "tx"); return err },
		"GetCurrentVersion":        func() error { _, err := s.GetCurrentVersion(ctx, "a"); return err },
		"ReadAfter":                func() error { _, err := s.ReadAfter(ctx, 0, 0); return err },
		"HeadPosition":             func() error { _, err := s.HeadPosition(ctx); return err },
	}
	for name, call := range calls {
		err := call()
		require.Error(t, err, name)
		require.Contains(t, err.Error(), "closed", name)
	}
}

// TestGormEventStoreCloseLeavesTheDatabaseOpen: the *gorm.DB belongs to
// the caller; Close does not close it.
func TestGormEventStoreCloseLeavesTheDatabaseOpen(t *testing.T) {
	ctx := testCtx(t)
	db := dbtest.NewSQLiteMemory(t)
	s := newGormStore(t, db)
	require.NoError(t, s.Append(ctx, "a", 0, newEvent("a", "x", nil)))
	require.NoError(t, s.Close())
	sqlDB, err := db.DB()
	require.NoError(t, err)
	require.NoError(t, sqlDB.PingContext(ctx))
	var n int
	require.NoError(t, db.Raw("SELECT COUNT(*) FROM events").Scan(&n).Error)
	require.Equal(t, 1, n)
	var _ domain.EventStore = s
}
