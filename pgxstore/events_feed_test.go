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

// TestSchemaPostgresFeedSuite runs the ordered-feed tests against
// NewEventStore given the suite's schema by WithSchema, on a pool whose
// search_path names another, empty schema, alone and with search_path
// stores of both kinds appending to the same table: one table, one
// append lock, however a store names it.
func TestSchemaPostgresFeedSuite(t *testing.T) {
	open := func(t testing.TB, pg *dbtest.Postgres) func(context.Context) (domain.EventStore, error) {
		pool := dbtest.NewPostgres(t).OpenPgx(t)
		return func(ctx context.Context) (domain.EventStore, error) {
			return pgxstore.NewEventStore(ctx, pool, pgxstore.WithSchema(pg.Schema))
		}
	}
	pgfeed.RunSuite(t,
		pgfeed.Store{
			Name: "pgx-schema",
			New: func(t testing.TB, pg *dbtest.Postgres) domain.EventStore {
				s, err := open(t, pg)(testCtx(t))
				require.NoError(t, err)
				return s
			},
			Construct: open,
		},
		pgfeed.Store{Name: "pgx", New: func(t testing.TB, pg *dbtest.Postgres) domain.EventStore { return newEventStoreOn(t, pg) }},
		pgfeed.Store{Name: "gorm", New: func(t testing.TB, pg *dbtest.Postgres) domain.EventStore { return newGormEventStore(t, pg) }},
	)
}
