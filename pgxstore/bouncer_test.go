package pgxstore_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/internal/feedtest"
	"github.com/eventfeed/subscriptions/internal/feedtest/pgfeed"
	"github.com/eventfeed/subscriptions/pgxstore"
	"github.com/eventfeed/subscriptions/subscriptionstest"
)

// bouncerServerConns is how many server connections each test's PgBouncer
// opens: fewer than the pools' client connections, as in production.
const bouncerServerConns = 3

// bouncerPool is a pool through a PgBouncer of its own in transaction
// pooling mode in front of pg's schema (dbtest.Postgres.BouncerDSN), as
// another process behind the same kind of pooler would have.
func bouncerPool(t testing.TB, pg *dbtest.Postgres) *pgxpool.Pool {
	t.Helper()
	return dbtest.OpenPgxDSN(t, pg.BouncerDSN(t, bouncerServerConns))
}

// TestBehindPgBouncer runs the backend's conformance suites, the ordered
// feed's tests and replicas' exactly-once through PgBouncer in
// transaction pooling mode: statements of one transaction reach one server
// connection, the next transaction maybe another, and nothing of a session
// (prepared statements, session settings, session locks) outlives a
// transaction. The listener connects to the server directly (LISTEN is a
// session's).
func TestBehindPgBouncer(t *testing.T) {
	t.Run("checkpoint store", func(t *testing.T) {
		subscriptionstest.RunCheckpointStoreSuite(t, subscriptionstest.CheckpointStoreHarness{
			Name: "pgx-pgbouncer",
			New: func(t *testing.T) (subscriptions.CheckpointStore, subscriptions.CheckpointStore) {
				pg := dbtest.NewPostgres(t)
				return newCheckpointStore(t, bouncerPool(t, pg)), newCheckpointStore(t, bouncerPool(t, pg))
			},
			Transactional: true,
			InTx:          inTx,
		})
	})
	t.Run("event store", func(t *testing.T) {
		subscriptionstest.RunEventStoreSuite(t, subscriptionstest.EventStoreHarness{
			Name: "pgx-pgbouncer",
			New: func(t *testing.T) domain.EventStore {
				s, err := pgxstore.NewEventStore(testCtx(t), bouncerPool(t, dbtest.NewPostgres(t)))
				require.NoError(t, err)
				return s
			},
			MaxIdentifierBytes: pgxstore.MaxIdentifierBytes,
		})
	})
	t.Run("parking lot", func(t *testing.T) {
		subscriptionstest.RunParkingLotSuite(t, subscriptionstest.ParkingLotHarness{
			Name:          "pgx-pgbouncer",
			Transactional: true,
			InTx:          inPgxTx,
			New: func(t *testing.T) subscriptions.ParkingLot {
				lot, err := pgxstore.NewParkingLot(testCtx(t), bouncerPool(t, dbtest.NewPostgres(t)))
				require.NoError(t, err)
				return lot
			},
		})
	})
	t.Run("ordered feed", func(t *testing.T) {
		pgfeed.RunSuite(t, pgfeed.Store{
			Name: "pgx-pgbouncer",
			New: func(t testing.TB, pg *dbtest.Postgres) domain.EventStore {
				s, err := pgxstore.NewEventStore(testCtx(t), bouncerPool(t, pg))
				require.NoError(t, err)
				return s
			},
			Construct: func(t testing.TB, pg *dbtest.Postgres) func(context.Context) (domain.EventStore, error) {
				pool := bouncerPool(t, pg)
				return func(ctx context.Context) (domain.EventStore, error) { return pgxstore.NewEventStore(ctx, pool) }
			},
		})
	})
	t.Run("replicas exactly once", testReplicasBehindPgBouncer)
	t.Run("needs a query mode without named prepared statements", func(t *testing.T) {
		// pgx's default statement cache names prepared statements per
		// client connection; two client connections sharing a server
		// connection then collide (PgBouncer 1.18 keeps no prepared
		// statements). The exec mode BouncerDSN selects has none.
		pg := dbtest.NewPostgres(t)
		dsn := strings.Replace(pg.BouncerDSN(t, 1), "default_query_exec_mode=exec", "default_query_exec_mode=cache_statement", 1)
		pool := dbtest.OpenPgxDSN(t, dsn)
		ctx := testCtx(t)
		a, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer a.Release()
		b, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer b.Release()
		var one int
		require.NoError(t, a.QueryRow(ctx, "SELECT $1::int", 1).Scan(&one))
		err = b.QueryRow(ctx, "SELECT $1::int", 1).Scan(&one)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "42P05", pgErr.Code, "duplicate prepared statement: the two clients shared a server connection")
	})
}

// testReplicasBehindPgBouncer: three replicas of one name, each through a
// PgBouncer of its own (three processes), woken by a listener on a
// direct connection, follow appends made through PgBouncer too, one of
// them inside a caller's transaction; a reset and a pause go through it
// as well. Every event is projected exactly once.
func testReplicasBehindPgBouncer(t *testing.T) {
	pg := dbtest.NewPostgres(t)
	ctx := testCtx(t)
	writerPool := bouncerPool(t, pg)
	events, err := pgxstore.NewEventStore(ctx, writerPool)
	require.NoError(t, err)
	_, err = writerPool.Exec(ctx, "CREATE TABLE seen (event_id text PRIMARY KEY, n integer NOT NULL, by text NOT NULL)")
	require.NoError(t, err)

	listener, err := subscriptions.NewPostgresListener(pg.DSN, subscriptions.WithListenerLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	lctx, stopListener := context.WithCancel(ctx)
	listenerDone := make(chan error, 1)
	go func() { listenerDone <- listener.Run(lctx) }()
	defer func() {
		stopListener()
		require.NoError(t, <-listenerDone)
	}()

	const name = "behind-pgbouncer"
	var subs []*subscriptions.Subscriber
	for i := range 3 {
		pool := bouncerPool(t, pg)
		replicaEvents, err := pgxstore.NewEventStore(ctx, pool)
		require.NoError(t, err)
		sub, err := subscriptions.NewSubscriber(name, replicaEvents, newCheckpointStore(t, pool), projectPgx(fmt.Sprintf("r%d", i)),
			subscriptions.WithBatchSize(7), subscriptions.WithPollInterval(50*time.Millisecond),
			subscriptions.WithWakeSignal(listener.Subscribe()),
			subscriptions.WithLogger(slog.New(slog.DiscardHandler)))
		require.NoError(t, err)
		subs = append(subs, sub)
	}
	rctx, stop := context.WithCancel(ctx)
	var running sync.WaitGroup
	for _, sub := range subs {
		running.Go(func() { require.NoError(t, sub.Run(rctx)) })
	}
	defer func() {
		stop()
		running.Wait()
	}()

	const writers, perWriter = 4, 50
	var appending sync.WaitGroup
	for w := range writers {
		appending.Go(func() {
			for i := range perWriter {
				agg := feedtest.UniqueID(fmt.Sprintf("w%d", w))
				ev := feedtest.NewEvent(agg, "x.happened", i)
				if w == 0 {
					tx, err := writerPool.Begin(ctx)
					require.NoError(t, err)
					require.NoError(t, events.AppendTx(ctx, tx, agg, 0, ev))
					require.NoError(t, tx.Commit(ctx))
					continue
				}
				require.NoError(t, events.Append(ctx, agg, 0, ev))
			}
		})
	}
	appending.Wait()
	_, err = subs[0].WaitCaughtUp(ctx)
	require.NoError(t, err)
	seen := func() (rows, total int) {
		require.NoError(t, writerPool.QueryRow(ctx, "SELECT count(*), COALESCE(sum(n), 0) FROM seen").Scan(&rows, &total))
		return rows, total
	}
	rows, total := seen()
	require.Equal(t, writers*perWriter, rows)
	require.Equal(t, writers*perWriter, total, "every event projected exactly once")

	// A pause holds every replica; a reset with the projection emptied
	// replays the feed once more, exactly once, after the resume.
	require.NoError(t, subs[1].Pause(ctx, "through pgbouncer"))
	st, err := subs[2].Status(ctx)
	require.NoError(t, err)
	require.True(t, st.Paused)
	require.NoError(t, subs[2].ResetCheckpointWith(ctx, 0, func(ctx context.Context) error {
		_, err := pgxstore.TxFromContext(ctx).Exec(ctx, "DELETE FROM seen")
		return err
	}))
	require.NoError(t, events.Append(ctx, "after-reset", 0, feedtest.NewEvent("after-reset", "x.happened", 0)))
	rows, _ = seen()
	require.Zero(t, rows, "nothing handled while paused")
	require.NoError(t, subs[0].Resume(ctx))
	_, err = subs[1].WaitCaughtUp(ctx)
	require.NoError(t, err)
	rows, total = seen()
	require.Equal(t, writers*perWriter+1, rows)
	require.Equal(t, writers*perWriter+1, total)
}
