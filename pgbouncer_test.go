package subscriptions_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/subscriptionstest"
)

// throughBouncer opens a GORM pool on pg's schema through a PgBouncer of
// its own in transaction pooling mode (dbtest.Postgres.BouncerDSN), with
// fewer server connections than the pool's client connections, as
// another process behind the pooler would have.
func throughBouncer(t testing.TB, pg *dbtest.Postgres) *gorm.DB {
	t.Helper()
	return dbtest.OpenPostgresDSN(t, pg.BouncerDSN(t, 3))
}

// TestGormBehindPgBouncer runs the GORM Postgres backend's checkpoint and
// parking-lot suites and replicas' exactly-once through PgBouncer in
// transaction pooling mode (pgxstore's TestBehindPgBouncer runs the pgx
// backend's suites, infrastructure's the event store's). The checkpoint
// suite's abandoned resets send cancel requests through the pooler, which
// PgBouncer 1.18 did not survive when one was cut short
// (cancelBackendOnDone lets them finish).
func TestGormBehindPgBouncer(t *testing.T) {
	t.Parallel()
	subscriptionstest.RunCheckpointStoreSuite(t, subscriptionstest.CheckpointStoreHarness{
		Name: "postgres-pgbouncer",
		New: func(t *testing.T) (subscriptions.CheckpointStore, subscriptions.CheckpointStore) {
			pg := dbtest.NewPostgres(t)
			return coreCheckpointStore(t, throughBouncer(t, pg)), coreCheckpointStore(t, throughBouncer(t, pg))
		},
		Transactional: true,
	})
	subscriptionstest.RunParkingLotSuite(t, subscriptionstest.ParkingLotHarness{
		Name:          "postgres-pgbouncer",
		Transactional: true,
		New: func(t *testing.T) subscriptions.ParkingLot {
			lot, err := subscriptions.NewGormParkingLot(throughBouncer(t, dbtest.NewPostgres(t)))
			require.NoError(t, err)
			return lot
		},
	})
	t.Run("replicas exactly once", func(t *testing.T) {
		pg := dbtest.NewPostgres(t)
		ctx := context.Background()
		writer := throughBouncer(t, pg)
		events, err := infrastructure.NewGormEventStore(writer)
		require.NoError(t, err)
		createProjection(t, writer, "bouncer_proj")
		listener, err := subscriptions.NewPostgresListener(pg.DSN, subscriptions.WithListenerLogger(slog.New(slog.DiscardHandler)))
		require.NoError(t, err)
		lctx, stopListener := context.WithCancel(ctx)
		listenerDone := make(chan error, 1)
		go func() { listenerDone <- listener.Run(lctx) }()
		t.Cleanup(func() {
			stopListener()
			require.NoError(t, <-listenerDone)
		})
		var subs []*subscriptions.Subscriber
		for range 3 {
			db := throughBouncer(t, pg)
			replicaEvents, err := infrastructure.NewGormEventStore(db)
			require.NoError(t, err)
			lot, err := subscriptions.NewGormParkingLot(db)
			require.NoError(t, err)
			sub, err := subscriptions.NewSubscriber("behind-pgbouncer", replicaEvents, coreCheckpointStore(t, db),
				func(ctx context.Context, ev domain.EventEnvelope[any]) error { return project(ctx, "bouncer_proj", ev) },
				subscriptions.WithBatchSize(7), subscriptions.WithPollInterval(50*time.Millisecond),
				subscriptions.WithParkingLot(lot), subscriptions.WithWakeSignal(listener.Subscribe()),
				subscriptions.WithLogger(slog.New(slog.DiscardHandler)))
			require.NoError(t, err)
			start(t, sub)
			subs = append(subs, sub)
		}
		const writers, perWriter = 4, 50
		var appending sync.WaitGroup
		var ids sync.Map
		for w := range writers {
			appending.Go(func() {
				for i := range perWriter {
					ev := domain.NewEventEnvelope[any](map[string]any{"i": i}, fmt.Sprintf("w%d-%d", w, i), "x.happened", 0)
					var err error
					if w == 0 {
						// A unit of work through the pooler.
						err = writer.Transaction(func(tx *gorm.DB) error {
							store, err := infrastructure.NewGormEventStore(tx)
							if err != nil {
								return err
							}
							return store.Append(ctx, ev.AggregateID, 0, ev)
						})
					} else {
						err = events.Append(ctx, ev.AggregateID, 0, ev)
					}
					require.NoError(t, err)
					ids.Store(ev.ID, true)
				}
			})
		}
		appending.Wait()
		_, err = subs[1].WaitCaughtUp(ctx)
		require.NoError(t, err)
		got := projected(t, writer, "bouncer_proj") // the primary key refuses a second write of an event
		require.Len(t, got, writers*perWriter)
		for _, id := range got {
			_, ok := ids.Load(id)
			require.True(t, ok, id)
		}
	})
}
