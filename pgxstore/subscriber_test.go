package pgxstore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// projectPgx is a handler that counts each event in the projection table
// through the batch transaction, as an sqlc-style handler would.
func projectPgx(by string) subscriptions.Handler {
	return func(ctx context.Context, e domain.EventEnvelope[any]) error {
		tx := pgxstore.TxFromContext(ctx)
		if tx == nil {
			return errors.New("no batch transaction in the handler's context")
		}
		_, err := tx.Exec(ctx, "INSERT INTO seen (event_id, n, by) VALUES ($1, 1, $2) ON CONFLICT (event_id) DO UPDATE SET n = seen.n + 1", e.ID, by)
		return err
	}
}

// projectGorm is projectPgx for a replica of the GORM backend.
func projectGorm(ctx context.Context, e domain.EventEnvelope[any]) error {
	tx := subscriptions.TxFromContext(ctx)
	if tx == nil {
		return errors.New("no batch transaction in the handler's context")
	}
	return tx.Exec("INSERT INTO seen (event_id, n, by) VALUES (?, 1, 'gorm') ON CONFLICT (event_id) DO UPDATE SET n = seen.n + 1", e.ID).Error
}

// TestMixedReplicasExactlyOnce: replicas of one subscriber name, two on
// the pgx backend (each its own pool, as separate processes) and one on
// the GORM backend, follow a feed that pgx and GORM writers append to at
// once, replicas stopping and starting meanwhile (a rolling switch).
// Every event is projected exactly once: the row lock and the
// compare-and-set commit are one protocol across the two backends.
func TestMixedReplicasExactlyOnce(t *testing.T) {
	t.Parallel()
	for _, partitions := range []int{0, 4} {
		t.Run(fmt.Sprintf("partitions=%d", partitions), func(t *testing.T) {
			t.Parallel()
			mixedReplicasExactlyOnce(t, partitions)
		})
	}
}

// mixedReplicasExactlyOnce is TestMixedReplicasExactlyOnce with the
// subscriber in partitions (0: unpartitioned), two at a time per replica.
func mixedReplicasExactlyOnce(t *testing.T, partitions int) {
	ctx := testCtx(t)
	pg, pool := newDatabase(t)
	_, err := pool.Exec(ctx, "CREATE TABLE seen (event_id text PRIMARY KEY, n integer NOT NULL, by text NOT NULL)")
	require.NoError(t, err)

	type replica struct {
		name string
		run  func(ctx context.Context) error
	}
	const name = "mixed-projection"
	quiet := subscriptions.WithLogger(slog.New(slog.DiscardHandler))
	partitioned := func(opts ...subscriptions.SubscriberOption) []subscriptions.SubscriberOption {
		if partitions > 0 {
			opts = append(opts, subscriptions.WithPartitions(partitions), subscriptions.WithConcurrency(2))
		}
		return opts
	}
	pgxReplica := func(by string, p *pgxpool.Pool) func(ctx context.Context) error {
		events, err := pgxstore.NewEventStore(ctx, p)
		require.NoError(t, err)
		checkpoints := newCheckpointStore(t, p)
		return func(ctx context.Context) error {
			s, err := subscriptions.NewSubscriber(name, events, checkpoints, projectPgx(by),
				partitioned(subscriptions.WithBatchSize(7), subscriptions.WithPollInterval(10*time.Millisecond), quiet)...)
			if err != nil {
				return err
			}
			return s.Run(ctx)
		}
	}
	gormReplica := func(db *gorm.DB) func(ctx context.Context) error {
		events, err := infrastructure.NewGormEventStore(db)
		require.NoError(t, err)
		checkpoints, err := subscriptions.NewGormCheckpointStore(db)
		require.NoError(t, err)
		return func(ctx context.Context) error {
			s, err := subscriptions.NewSubscriber(name, events, checkpoints, projectGorm,
				partitioned(subscriptions.WithBatchSize(5), subscriptions.WithPollInterval(10*time.Millisecond), quiet)...)
			if err != nil {
				return err
			}
			return s.Run(ctx)
		}
	}
	replicas := []replica{
		{"pgx-1", pgxReplica("pgx-1", pg.OpenPgx(t))},
		{"pgx-2", pgxReplica("pgx-2", pg.OpenPgx(t))},
		{"gorm", gormReplica(pg.Open(t))},
	}

	pgxEvents, err := pgxstore.NewEventStore(ctx, pool)
	require.NoError(t, err)
	gormEvents, err := infrastructure.NewGormEventStore(pg.Open(t))
	require.NoError(t, err)
	writers := []domain.EventStore{pgxEvents, gormEvents}

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	// Each replica runs in rounds: started, stopped after a while, started
	// again, so that the lock passes between the backends.
	for i, r := range replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; runCtx.Err() == nil; round++ {
				rctx, cancel := context.WithTimeout(runCtx, time.Duration(40+20*i)*time.Millisecond)
				err := r.run(rctx)
				cancel()
				if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
					errs <- fmt.Errorf("%s round %d: %w", r.name, round, err)
					return
				}
			}
		}()
	}
	const perWriter = 400
	var appended sync.WaitGroup
	for w, store := range writers {
		appended.Add(1)
		go func() {
			defer appended.Done()
			for i := range perWriter {
				agg := fmt.Sprintf("agg-%d-%d", w, i%10)
				ev := domain.NewEventEnvelope[any](map[string]any{"i": i}, agg, "counted", i/10+1)
				if err := store.Append(ctx, agg, i/10, ev); err != nil {
					errs <- fmt.Errorf("writer %d append %d: %w", w, i, err)
					return
				}
			}
		}()
	}
	appended.Wait()
	head, err := pgxEvents.HeadPosition(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2*perWriter, head)

	require.Eventually(t, func() bool {
		var projected int
		return pool.QueryRow(ctx, "SELECT count(*) FROM seen").Scan(&projected) == nil && projected == int(head)
	}, time.Minute, 20*time.Millisecond, "the replicas catch up with the feed")
	stop()
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	var events, total, maxN int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*), coalesce(sum(n), 0), coalesce(max(n), 0) FROM seen").Scan(&events, &total, &maxN))
	require.Equal(t, 2*perWriter, events, "every event projected")
	require.Equal(t, 1, maxN, "no event projected twice")
	require.Equal(t, 2*perWriter, total)
	var projectors int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(DISTINCT by) FROM seen").Scan(&projectors))
	require.GreaterOrEqual(t, projectors, 2, "the lock passed between replicas")
	var byGorm int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM seen WHERE by = 'gorm'").Scan(&byGorm))
	t.Logf("projected by %d replicas, %d events by the GORM one", projectors, byGorm)
}

// TestMixedReplicasShareTheAttemptCount: a pgx replica and a GORM replica
// of one name retrying a poison event count one count between them (the
// attempt records and their claims are one protocol): the event is
// attempted 1 + max retries times in all, then parked once, and every
// other event is projected exactly once.
func TestMixedReplicasShareTheAttemptCount(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pg, pool := newDatabase(t)
	_, err := pool.Exec(ctx, "CREATE TABLE seen (event_id text PRIMARY KEY, n integer NOT NULL, by text NOT NULL)")
	require.NoError(t, err)
	events, err := pgxstore.NewEventStore(ctx, pool)
	require.NoError(t, err)
	var ids []string
	for i := range 9 {
		ev := domain.NewEventEnvelope[any](map[string]any{"i": i}, fmt.Sprintf("agg-%d", i%3), "counted", i/3+1)
		require.NoError(t, events.Append(ctx, ev.AggregateID, i/3, ev))
		ids = append(ids, ev.ID)
	}
	poison := ids[4]
	var mu sync.Mutex
	attempts := 0
	failPoison := func(next subscriptions.Handler) subscriptions.Handler {
		return func(ctx context.Context, e domain.EventEnvelope[any]) error {
			if e.ID == poison {
				mu.Lock()
				attempts++
				mu.Unlock()
				return errors.New("poison")
			}
			return next(ctx, e)
		}
	}
	const name, maxRetries = "mixed-retries", 3
	opts := []subscriptions.SubscriberOption{
		subscriptions.WithMaxRetries(maxRetries),
		subscriptions.WithRetryBackoff(10*time.Millisecond, 10*time.Millisecond),
		subscriptions.WithPollInterval(5 * time.Millisecond),
		subscriptions.WithLogger(slog.New(slog.DiscardHandler)),
	}
	pgxPool := pg.OpenPgx(t)
	pgxLot, err := pgxstore.NewParkingLot(ctx, pgxPool)
	require.NoError(t, err)
	pgxEvents, err := pgxstore.NewEventStore(ctx, pgxPool)
	require.NoError(t, err)
	pgxSub, err := subscriptions.NewSubscriber(name, pgxEvents, newCheckpointStore(t, pgxPool), failPoison(projectPgx("pgx")),
		append(opts, subscriptions.WithParkingLot(pgxLot))...)
	require.NoError(t, err)
	db := pg.Open(t)
	gormEvents, err := infrastructure.NewGormEventStore(db)
	require.NoError(t, err)
	gormCheckpoints, err := subscriptions.NewGormCheckpointStore(db)
	require.NoError(t, err)
	gormLot, err := subscriptions.NewGormParkingLot(db)
	require.NoError(t, err)
	gormSub, err := subscriptions.NewSubscriber(name, gormEvents, gormCheckpoints, failPoison(projectGorm),
		append(opts, subscriptions.WithParkingLot(gormLot))...)
	require.NoError(t, err)

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, s := range []*subscriptions.Subscriber{pgxSub, gormSub} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = s.Run(runCtx)
		}()
	}
	defer func() {
		stop()
		wg.Wait()
	}()
	require.Eventually(t, func() bool {
		parked, err := pgxSub.ListParked(ctx)
		lag, lerr := pgxSub.Lag(ctx)
		return err == nil && lerr == nil && len(parked) == 1 && lag == 0
	}, time.Minute, 10*time.Millisecond, "the poison event is parked and the rest handled")
	stop()
	wg.Wait()
	parked, err := gormSub.ListParked(ctx)
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, poison, parked[0].EventID)
	require.Equal(t, 1+maxRetries, parked[0].Attempts)
	mu.Lock()
	require.Equal(t, 1+maxRetries, attempts, "attempts by both replicas together")
	mu.Unlock()
	var projected, maxN int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*), coalesce(max(n), 0) FROM seen").Scan(&projected, &maxN))
	require.Equal(t, len(ids)-1, projected)
	require.Equal(t, 1, maxN)
}

// TestHandlerCannotEndTheBatchTransaction: a handler that commits or rolls
// back the batch transaction itself (and ignores the refusal) gets an
// error wrapping ErrTxOwnedByBatch, nothing is ended, its event fails as
// a whole and is parked after its attempts; the events around it are
// projected exactly once, and nothing panics.
func TestHandlerCannotEndTheBatchTransaction(t *testing.T) {
	t.Parallel()
	for _, op := range []string{"Commit", "Rollback"} {
		t.Run(op, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			_, pool := newDatabase(t)
			_, err := pool.Exec(ctx, "CREATE TABLE seen (event_id text PRIMARY KEY, n integer NOT NULL, by text NOT NULL)")
			require.NoError(t, err)
			events, err := pgxstore.NewEventStore(ctx, pool)
			require.NoError(t, err)
			lot, err := pgxstore.NewParkingLot(ctx, pool)
			require.NoError(t, err)
			var ids []string
			for i := range 5 {
				ev := domain.NewEventEnvelope[any](map[string]any{"i": i}, "agg", "counted", i+1)
				require.NoError(t, events.Append(ctx, "agg", i, ev))
				ids = append(ids, ev.ID)
			}
			misbehaving := ids[2]
			var refusals []error
			var mu sync.Mutex
			project := projectPgx("pgx")
			handler := func(ctx context.Context, e domain.EventEnvelope[any]) error {
				if err := project(ctx, e); err != nil {
					return err
				}
				if e.ID == misbehaving {
					tx := pgxstore.TxFromContext(ctx)
					var err error
					if op == "Commit" {
						err = tx.Commit(ctx)
					} else {
						err = tx.Rollback(ctx)
					}
					mu.Lock()
					refusals = append(refusals, err)
					mu.Unlock()
				}
				return nil // the refusal swallowed
			}
			sub, err := subscriptions.NewSubscriber("misuse", events, newCheckpointStore(t, pool), handler,
				subscriptions.WithParkingLot(lot), subscriptions.WithMaxRetries(1),
				subscriptions.WithRetryBackoff(time.Millisecond, time.Millisecond),
				subscriptions.WithPollInterval(5*time.Millisecond), subscriptions.WithLogger(slog.New(slog.DiscardHandler)))
			require.NoError(t, err)
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- sub.Run(runCtx) }()
			require.Eventually(t, func() bool {
				lag, err := sub.Lag(ctx)
				return err == nil && lag == 0
			}, time.Minute, 5*time.Millisecond)
			stop()
			require.NoError(t, <-done)

			parked, err := sub.ListParked(ctx)
			require.NoError(t, err)
			require.Len(t, parked, 1)
			require.Equal(t, misbehaving, parked[0].EventID)
			require.Contains(t, parked[0].Error, op+" by a handler")
			mu.Lock()
			require.NotEmpty(t, refusals)
			for _, err := range refusals {
				require.ErrorIs(t, err, pgxstore.ErrTxOwnedByBatch)
			}
			mu.Unlock()
			rows, err := pool.Query(ctx, "SELECT event_id FROM seen ORDER BY event_id")
			require.NoError(t, err)
			seen, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			want := append(append([]string{}, ids[:2]...), ids[3:]...)
			require.ElementsMatch(t, want, seen, "the others projected once, the misbehaving event's write rolled back")
		})
	}
}
