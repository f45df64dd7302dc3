package pgxstore_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/internal/feedtest"
	"github.com/eventfeed/subscriptions/internal/wirecount"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// TestAcquireRoundTrips checks on the wire that a batch is acquired in
// one round trip (its BEGIN goes out with the row lock), and a wake-up's
// acquire with the read of the feed after it in one too.
func TestAcquireRoundTrips(t *testing.T) {
	t.Parallel()
	pg := dbtest.NewPostgres(t)
	ctx := testCtx(t)
	cfg, err := pgxpool.ParseConfig(pg.DSN)
	require.NoError(t, err)
	cfg.MaxConns = 1
	var wire wirecount.Counter
	cfg.ConnConfig.DialFunc = wire.Dial(cfg.ConnConfig.DialFunc)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	events, err := pgxstore.NewEventStore(ctx, pool)
	require.NoError(t, err)
	cps := newCheckpointStore(t, pool)
	require.NoError(t, events.Append(ctx, "rt-1", 0, feedtest.NewEvent("rt-1", "rt.happened", 1)))
	const name = "round-trips"

	// count runs f and returns the round trips it took.
	count := func(f func()) int64 {
		before := wire.Turns()
		f()
		return wire.Turns() - before
	}
	var b subscriptions.Batch
	defer func() {
		if b != nil {
			_ = b.Rollback() // a failed check leaves its batch open; the pool's Close would wait for it
		}
	}()
	acquireAfter := func() {
		var read []domain.EventEnvelope[any]
		var ok bool
		var err error
		b, read, ok, err = cps.AcquireAfter(ctx, name, 0, 10)
		require.NoError(t, err)
		require.True(t, ok)
		require.Len(t, read, 1)
	}
	acquire := func() {
		var ok bool
		var err error
		b, ok, err = cps.Acquire(ctx, name)
		require.NoError(t, err)
		require.True(t, ok)
	}
	rollback := func() { require.NoError(t, b.Rollback()) }
	// The first calls create the row and prepare the statements.
	acquire()
	rollback()
	acquireAfter()
	rollback()

	require.Equal(t, int64(1), count(acquire), "Acquire: BEGIN and the row lock in one round trip")
	require.Equal(t, int64(1), count(rollback))
	require.Equal(t, int64(1), count(acquireAfter), "AcquireAfter: BEGIN, the row lock and the read of the feed in one round trip")
	require.NoError(t, b.Commit(ctx, 0)) // prepares the compare-and-set
	acquire()
	require.Equal(t, int64(2), count(func() { require.NoError(t, b.Commit(ctx, 1)) }), "the compare-and-set, then COMMIT")
}
