package subscriptions_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestPoolBudget runs more work than the pool has connections, on one
// *gorm.DB (or pgxstore's *pgxpool.Pool) whose pool holds 1, 2 or 3
// connections: two replicas of one
// name with a parking lot and a poison event, a partitioned subscriber
// with two workers, a batch-handler subscriber, two appending goroutines
// and a loop of admin calls (Lag, ListParked, Status, a reset of a fourth
// name). None of them may wait for a second connection while it holds one
// (doc.go, "Connections"), so every call must finish and every event be
// projected exactly once, the poison one parked instead.
func TestPoolBudget(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"gorm", "pgx"} {
		for _, conns := range []int{1, 2, 3} {
			t.Run(fmt.Sprintf("%s/pool-%d", backend, conns), func(t *testing.T) {
				t.Parallel()
				poolBudgetRun(t, conns, backend == "pgx")
			})
		}
	}
}

// poolBudgetRun runs the scenario on a pool of conns connections: the
// GORM backend's *gorm.DB, or with pgx pgxstore's *pgxpool.Pool.
func poolBudgetRun(t *testing.T, conns int, pgx bool) {
	pg := dbtest.NewPostgres(t)
	var e *env
	if pgx {
		cfg, err := pgxpool.ParseConfig(pg.DSN)
		require.NoError(t, err)
		cfg.MaxConns = int32(conns)
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		e = pgxEnvOn(t, pg, pool)
	} else {
		gdb := pg.Open(t)
		sqlDB, err := gdb.DB()
		require.NoError(t, err)
		e = gormEnv(t, "postgres", gdb, pg)
		sqlDB.SetMaxOpenConns(conns)
	}
	db := e.DB // on pgx a GORM pool of its own on the schema, for the test's reads
	events := e.Events
	const tables = 3
	for i := 0; i < tables; i++ {
		createProjection(t, db, fmt.Sprintf("budget_%d", i))
	}

	var poisonID atomic.Value
	poisonID.Store("")
	handler := func(table string) subscriptions.Handler {
		return func(ctx context.Context, ev domain.EventEnvelope[any]) error {
			if ev.ID == poisonID.Load().(string) {
				return errors.New("poison")
			}
			return e.project(ctx, table, ev)
		}
	}
	common := []subscriptions.SubscriberOption{
		subscriptions.WithBatchSize(4),
		subscriptions.WithPollInterval(20 * time.Millisecond),
		subscriptions.WithLogger(quietLogger()),
		subscriptions.WithParkingLot(e.Parking),
		subscriptions.WithMaxRetries(2),
		subscriptions.WithRetryBackoff(time.Millisecond, 5*time.Millisecond),
	}
	var subs []*subscriptions.Subscriber
	for i := 0; i < 2; i++ { // two replicas of one name
		sub, err := subscriptions.NewSubscriber("budget-replicated", events, e.Checkpoints, handler("budget_0"), common...)
		require.NoError(t, err)
		subs = append(subs, sub)
	}
	part, err := subscriptions.NewSubscriber("budget-partitioned", events, e.Checkpoints, handler("budget_1"),
		append(common, subscriptions.WithPartitions(4), subscriptions.WithConcurrency(2))...)
	require.NoError(t, err)
	subs = append(subs, part)
	batch, err := subscriptions.NewSubscriber("budget-batch", events, e.Checkpoints, nil,
		append(common, subscriptions.WithBatchHandler(func(ctx context.Context, evs []domain.EventEnvelope[any]) error {
			for _, ev := range evs {
				if err := handler("budget_2")(ctx, ev); err != nil {
					return err
				}
			}
			return nil
		}))...)
	require.NoError(t, err)
	subs = append(subs, batch)
	reset, err := subscriptions.NewSubscriber("budget-reset", events, e.Checkpoints, handler("budget_0"), common...)
	require.NoError(t, err)
	for _, sub := range subs {
		start(t, sub)
	}

	// A poison event among the first ones: every subscriber retries it
	// (attempt records) and parks it. It is known as poison before it is
	// appended: the running subscribers may handle it at once.
	var first []string
	var firstEvents []domain.EventEnvelope[any]
	for i := range 3 {
		ev := domain.NewEventEnvelope[any](map[string]any{"n": i}, fmt.Sprintf("agg-%d", i%3), "budget", 0)
		first = append(first, ev.ID)
		firstEvents = append(firstEvents, ev)
	}
	poisonID.Store(first[1])
	for _, ev := range firstEvents {
		require.NoError(t, events.Append(context.Background(), ev.AggregateID, -1, ev))
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	ids := append([]string(nil), first...)
	const perWriter = 60
	var failures []string
	call := func(what string, err error) {
		if err != nil && ctx.Err() == nil {
			mu.Lock()
			failures = append(failures, what+": "+err.Error())
			mu.Unlock()
		}
	}
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWriter; i++ {
				ev := domain.NewEventEnvelope[any](map[string]any{"n": i}, fmt.Sprintf("budget-%d-%d", w, i%5), "budget", 0)
				actx, acancel := context.WithTimeout(ctx, 20*time.Second)
				err := events.Append(actx, ev.AggregateID, -1, ev)
				acancel()
				call("append", err)
				if err == nil {
					mu.Lock()
					ids = append(ids, ev.ID)
					mu.Unlock()
				}
			}
		}()
	}
	adminDone := make(chan struct{})
	go func() {
		defer close(adminDone)
		for ctx.Err() == nil {
			for _, sub := range []*subscriptions.Subscriber{subs[0], part, batch} {
				cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
				_, err := sub.Lag(cctx)
				call("Lag", err)
				_, err = sub.ListParked(cctx)
				call("ListParked", err)
				_, err = sub.Status(cctx)
				call("Status", err)
				ccancel()
			}
			cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
			call("ResetCheckpoint", reset.ResetCheckpoint(cctx, 0))
			ccancel()
		}
	}()
	wg.Wait()
	for _, sub := range subs {
		waitCaughtUp(t, sub)
	}
	cancel()
	<-adminDone
	require.Empty(t, failures, "calls failed with a pool of %d connections", len(failures))

	mu.Lock()
	want := make([]string, 0, len(ids)-1)
	for _, id := range ids {
		if id != first[1] {
			want = append(want, id)
		}
	}
	mu.Unlock()
	for i, sub := range subs[2:] {
		table := fmt.Sprintf("budget_%d", i+1)
		requireSameIDs(t, table, want, projected(t, db, table))
		parked, err := sub.ListParked(context.Background())
		require.NoError(t, err)
		require.Len(t, parked, 1, "%s parked", sub.Name())
		require.Equal(t, first[1], parked[0].EventID)
		require.Equal(t, 3, parked[0].Attempts, "%s: 1 + WithMaxRetries attempts, counted across its replicas and partitions", sub.Name())
	}
	requireSameIDs(t, "budget_0", want, projected(t, db, "budget_0"))
	parked, err := subs[0].ListParked(context.Background())
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, 3, parked[0].Attempts)
}

// requireSameIDs requires got to hold every ID of want once, and nothing
// else: exactly-once, whatever the order.
func requireSameIDs(t testing.TB, what string, want, got []string) {
	t.Helper()
	seen := make(map[string]int, len(got))
	var dups []string
	for _, id := range got {
		seen[id]++
		if seen[id] == 2 {
			dups = append(dups, id)
		}
	}
	var missing []string
	for _, id := range want {
		if seen[id] == 0 {
			missing = append(missing, id)
		}
		delete(seen, id)
	}
	var extra []string
	for id := range seen {
		extra = append(extra, id)
	}
	require.True(t, len(dups) == 0 && len(missing) == 0 && len(extra) == 0,
		"%s: %d duplicates %v, %d missing %v, %d unexpected %s", what, len(dups), dups, len(missing), missing, len(extra), strings.Join(extra, ","))
}
