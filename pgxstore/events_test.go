package pgxstore_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/pgxstore"
	"github.com/eventfeed/subscriptions/subscriptionstest"
)

// newEventStore returns an event store on a fresh schema, and the schema.
func newEventStore(t testing.TB, opts ...pgxstore.Option) (*pgxstore.EventStore, *dbtest.Postgres) {
	t.Helper()
	pg := dbtest.NewPostgres(t)
	return newEventStoreOn(t, pg, opts...), pg
}

// newEventStoreOn returns an event store on pg's schema, on a pgx pool of
// its own, closed at cleanup.
func newEventStoreOn(t testing.TB, pg *dbtest.Postgres, opts ...pgxstore.Option) *pgxstore.EventStore {
	t.Helper()
	s, err := pgxstore.NewEventStore(testCtx(t), pg.OpenPgx(t), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

// TestEventStoreSuite runs the exported domain.EventStore conformance
// suite, and with it RunPartitionFeedSuite (subscriptions.PartitionFeed
// and subscriptions.FeedIndex), against NewEventStore.
func TestEventStoreSuite(t *testing.T) {
	subscriptionstest.RunEventStoreSuite(t, subscriptionstest.EventStoreHarness{
		Name:               "pgx",
		New:                func(t *testing.T) domain.EventStore { s, _ := newEventStore(t); return s },
		MaxIdentifierBytes: pgxstore.MaxIdentifierBytes,
	})
}

// TestConstantsMatchInfrastructure: the values this package copies (it
// may not import infrastructure) are infrastructure's.
func TestConstantsMatchInfrastructure(t *testing.T) {
	require.Equal(t, infrastructure.MaxIdentifierBytes, pgxstore.MaxIdentifierBytes)
	require.Equal(t, infrastructure.PostgresNotifyChannel, pgxstore.DefaultNotifyChannel)
}
