package pgxstore_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/feedtest/pgfeed"
	"github.com/eventfeed/subscriptions/internal/wirecount"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// TestLoneAppendRoundTrips checks on the wire that a lone Append is one
// round trip of two statements (pgfeed.RequireLoneAppendRoundTrips).
func TestLoneAppendRoundTrips(t *testing.T) {
	t.Parallel()
	pgfeed.RequireLoneAppendRoundTrips(t, func(t testing.TB, dsn string, wire *wirecount.Counter) domain.EventStore {
		cfg, err := pgxpool.ParseConfig(dsn)
		require.NoError(t, err)
		cfg.MaxConns = 1
		cfg.ConnConfig.DialFunc, cfg.ConnConfig.Tracer = wire.Dial(cfg.ConnConfig.DialFunc), wire
		pool, err := pgxpool.NewWithConfig(testCtx(t), cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		s, err := pgxstore.NewEventStore(testCtx(t), pool)
		require.NoError(t, err)
		return s
	})
}
