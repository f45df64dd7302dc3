package infrastructure_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/internal/feedtest"
	"github.com/eventfeed/subscriptions/internal/feedtest/pgfeed"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// The GORM stores the Postgres feed suite runs on: the pipelined pgx
// append path (GORM's Postgres driver is pgx's), the portable
// database/sql one, the pipelined one through PgBouncer in transaction
// pooling mode, and both paths given the suite's schema by WithSchema on
// a pool whose search_path names another, empty one.
var gormPostgresStores = []pgfeed.Store{
	gormPostgresStore("gorm", false, (*dbtest.Postgres).Open),
	gormPostgresStore("gorm-portable", true, (*dbtest.Postgres).Open),
	gormPostgresStore("gorm-pgbouncer", false, openThroughBouncer),
	gormPostgresStore("gorm-schema", false, openElsewhere, infrastructure.WithSchema),
	gormPostgresStore("gorm-schema-portable", true, openElsewhere, infrastructure.WithSchema),
}

// openElsewhere opens a pool whose search_path names a fresh, empty
// schema of its own, not pg's: a store on it reaches pg's tables only
// through WithSchema(pg.Schema).
func openElsewhere(_ *dbtest.Postgres, t testing.TB) *gorm.DB { return dbtest.NewPostgres(t).DB }

// openThroughBouncer opens a pool on pg's schema through a PgBouncer of
// its own (dbtest.Postgres.BouncerDSN), as another process behind the
// pooler would.
func openThroughBouncer(pg *dbtest.Postgres, t testing.TB) *gorm.DB {
	return dbtest.OpenPostgresDSN(t, pg.BouncerDSN(t, 3))
}

// gormPostgresStore is a GORM store on the pool open opens for pg, given
// pg's schema through withSchema when that is not nil.
func gormPostgresStore(name string, portable bool, open func(*dbtest.Postgres, testing.TB) *gorm.DB, withSchema ...func(string) infrastructure.GormEventStoreOption) pgfeed.Store {
	build := func(db *gorm.DB, pg *dbtest.Postgres) (*infrastructure.GormEventStore, error) {
		var opts []infrastructure.GormEventStoreOption
		for _, with := range withSchema {
			opts = append(opts, with(pg.Schema))
		}
		s, err := infrastructure.NewGormEventStore(db, opts...)
		if err == nil && portable {
			infrastructure.PortableAppendOnly(s)
		}
		return s, err
	}
	return pgfeed.Store{
		Name: name,
		New: func(t testing.TB, pg *dbtest.Postgres) domain.EventStore {
			s, err := build(open(pg, t), pg)
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		Construct: func(t testing.TB, pg *dbtest.Postgres) func(context.Context) (domain.EventStore, error) {
			db := open(pg, t)
			return func(context.Context) (domain.EventStore, error) { return build(db, pg) }
		},
	}
}

// TestPostgresFeedSuite runs the ordered-feed tests of the spec against
// each GORM append path, alone and with a pgxstore.EventStore appending to
// the same events table (the second append behind a held one, half the
// writers a follower reads).
func TestPostgresFeedSuite(t *testing.T) {
	pgx := pgfeed.Store{Name: "pgx", New: func(t testing.TB, pg *dbtest.Postgres) domain.EventStore {
		s, err := pgxstore.NewEventStore(testCtx(t), pg.OpenPgx(t))
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, s.Close()) })
		return s
	}}
	for _, s := range gormPostgresStores {
		t.Run(s.Name, func(t *testing.T) { pgfeed.RunSuite(t, s, pgx) })
	}
}

// TestFeedFollowerReadsEveryEventOnce appends multi-event batches from
// many goroutines while a follower pages through the feed as a subscriber
// does, on every backend: every event is read exactly once, in strictly
// increasing positions, none missing. The Postgres backends the suite
// above covers (the same stores on a fresh schema) are left to it.
func TestFeedFollowerReadsEveryEventOnce(t *testing.T) {
	t.Parallel() // every backend opens a store of its own
	for _, b := range storeBackends() {
		if b.name == "postgres" || b.name == "postgres-portable" || b.name == "postgres-schema" {
			continue // TestPostgresFeedSuite/{gorm,gorm-portable,gorm-schema}/follower_reads_every_event_once
		}
		t.Run(b.name, func(t *testing.T) {
			feedtest.RequireFollowerReadsEveryEventOnce(t, b.open(t))
		})
	}
}
