package pgxstore_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/internal/feedtest/pgfeed"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// newGormEventStore returns a GormEventStore on pg's schema, on a pool of
// its own, as another process would have.
func newGormEventStore(t testing.TB, pg *dbtest.Postgres) *infrastructure.GormEventStore {
	t.Helper()
	s, err := infrastructure.NewGormEventStore(pg.Open(t))
	require.NoError(t, err)
	return s
}

// TestPostgresFeedSuite runs the ordered-feed tests of the spec against
// NewEventStore, alone and with a GormEventStore appending to the same
// events table (the second append behind a held one, half the writers a
// follower reads).
func TestPostgresFeedSuite(t *testing.T) {
	pgfeed.RunSuite(t,
		pgfeed.Store{
			Name: "pgx",
			New:  func(t testing.TB, pg *dbtest.Postgres) domain.EventStore { return newEventStoreOn(t, pg) },
			Construct: func(t testing.TB, pg *dbtest.Postgres) func(context.Context) (domain.EventStore, error) {
				pool := pg.OpenPgx(t)
				return func(ctx context.Context) (domain.EventStore, error) { return pgxstore.NewEventStore(ctx, pool) }
			},
		},
		pgfeed.Store{Name: "gorm", New: func(t testing.TB, pg *dbtest.Postgres) domain.EventStore { return newGormEventStore(t, pg) }},
	)
}
