package subscriptions_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestFaultPartitionCrashLoop: three child processes run one partitioned
// subscriber (8 partitions, 2 workers each) over Postgres while events
// arrive, and the parent SIGKILLs a random one at random moments and
// starts it again (6 kills in the short form, 120 in the long one). At
// the end every event is in the projection exactly once, each aggregate's
// events were handled in feed order, and no partition is left behind.
func TestFaultPartitionCrashLoop(t *testing.T) {
	t.Parallel()
	bin := faultBuildChild(t)
	pg := dbtest.NewPostgres(t)
	db := pg.DB
	const name, table, parts = "fault-parts", "fault_parts_proj", 8
	events, err := infrastructure.NewGormEventStore(db)
	require.NoError(t, err)
	cps, err := subscriptions.NewGormCheckpointStore(db)
	require.NoError(t, err)
	faultCreateChildProjection(t, db, table)

	// A backlog over 24 aggregates, so that every partition has work, then
	// the writer's live events.
	for i := 0; i < 480; i++ {
		agg := fmt.Sprintf("fault-part-agg-%d", i%24)
		ev := domain.NewEventEnvelope[any](map[string]any{"i": i}, agg, "fault.parts", 0)
		require.NoError(t, events.Append(context.Background(), agg, -1, ev))
	}
	// Child i runs the GORM backend or pgxstore's, alternately: replicas
	// of both kinds share the partitions.
	args := func(i int) []string {
		return []string{"-driver", []string{"postgres", "pgx"}[i%2], "-dsn", pg.DSN, "-name", name, "-batch", "10", "-poll", "50ms", "-table", table,
			"-listen", "-partitions", fmt.Sprint(parts), "-concurrency", "2", "-delay", "1ms"}
	}
	w := faultStartWriter(t, events, "fault.parts.live", 15*time.Millisecond, 3, 1_000_000)

	rng := faultRand(t)
	children := make([]*faultChild, 3)
	for i := range children {
		children[i] = faultStartChild(t, bin, args(i)...)
	}
	kills := faultScale(6, 120)
	for k := 0; k < kills; k++ {
		i := rng.IntN(len(children))
		if rng.IntN(3) > 0 {
			children[i].waitReady(t)
		}
		time.Sleep(time.Duration(rng.IntN(200)) * time.Millisecond)
		children[i].kill(t)
		faultRequireCleanOutput(t, children[i].out.String())
		children[i] = faultStartChild(t, bin, args(i)...)
	}
	appended, failures, last := w.stop()
	require.Zero(t, failures, "the writer's appends failed (last: %v)", last)

	// The survivors catch up; no partition may be left behind.
	watch, err := subscriptions.NewSubscriber(name, events, cps, func(context.Context, domain.EventEnvelope[any]) error { return nil },
		subscriptions.WithPartitions(parts))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		lag, err := watch.Lag(context.Background())
		return err == nil && lag == 0
	}, 2*time.Minute, 20*time.Millisecond)
	for _, c := range children {
		c.term(t)
		faultRequireCleanOutput(t, c.out.String())
	}
	lags, err := watch.PartitionLags(context.Background())
	require.NoError(t, err)
	require.Equal(t, make([]int64, parts), lags)

	feed := faultFeedIDs(t, events)
	require.Len(t, feed, 480+len(appended))
	faultRequireExactlyOnce(t, "partitioned projection", faultProjectedIDs(t, db, table), feed)

	// Per aggregate, the handling times follow feed order.
	var rows []struct {
		AggregateID string
		Position    int64
		HandledAt   int64
	}
	require.NoError(t, db.Raw("SELECT e.aggregate_id, p.position, p.handled_at FROM "+table+
		" p JOIN events e ON e.id = p.event_id ORDER BY e.aggregate_id, p.position").Scan(&rows).Error)
	require.Len(t, rows, len(feed))
	for i := 1; i < len(rows); i++ {
		if rows[i].AggregateID == rows[i-1].AggregateID {
			require.Greater(t, rows[i].HandledAt, rows[i-1].HandledAt, "aggregate %s: position %d handled before position %d",
				rows[i].AggregateID, rows[i].Position, rows[i-1].Position)
		}
	}
	t.Logf("%d kills of 3 partitioned replicas, %d events", kills, len(feed))
}

// faultPartRig is a partitioned subscriber's replicas in one test process,
// each on a pool of its own (as separate processes would have), every pool
// with the test's application_name, so that faultTerminate reaches the
// workers' connections and nobody else's. They project through the batch
// transaction into table, counting each event's committed handlings and
// recording, per aggregate, any event handled while a later one of its
// aggregate was already projected.
type faultPartRig struct {
	name, table string
	parts       int
	admin       *gorm.DB
	events      domain.EventStore // on admin, never disturbed
	subs        []*subscriptions.Subscriber
	runs        []*running
	logs        []*logBuffer

	mu         sync.Mutex
	violations []string
}

func faultNewPartRig(t *testing.T, pg *dbtest.Postgres, app, name, table string, parts, replicas, workers int) *faultPartRig {
	t.Helper()
	rig := &faultPartRig{name: name, table: table, parts: parts, admin: pg.DB}
	var err error
	rig.events, err = infrastructure.NewGormEventStore(pg.DB)
	require.NoError(t, err)
	require.NoError(t, pg.DB.Exec("CREATE TABLE "+table+
		" (event_id text PRIMARY KEY, agg text NOT NULL, position bigint NOT NULL, handled int NOT NULL, handled_at bigint NOT NULL)").Error)
	require.NoError(t, pg.DB.Exec("CREATE INDEX ON "+table+" (agg, position)").Error)
	upsert := "INSERT INTO " + table + " (event_id, agg, position, handled, handled_at) VALUES (?, ?, ?, 1, ?) " +
		"ON CONFLICT (event_id) DO UPDATE SET handled = " + table + ".handled + 1, handled_at = excluded.handled_at"
	handler := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		tx := subscriptions.TxFromContext(ctx)
		if tx == nil {
			return errors.New("no batch transaction")
		}
		var later int
		if err := tx.Raw("SELECT count(*) FROM "+table+" WHERE agg = ? AND position > ?", ev.AggregateID, ev.Position).Scan(&later).Error; err != nil {
			return err
		}
		if later > 0 {
			rig.mu.Lock()
			rig.violations = append(rig.violations, fmt.Sprintf("%s: position %d handled after %d later events of its aggregate", ev.AggregateID, ev.Position, later))
			rig.mu.Unlock()
		}
		return tx.Exec(upsert, ev.ID, ev.AggregateID, ev.Position, time.Now().UnixNano()).Error
	}
	for i := 0; i < replicas; i++ {
		db := dbtest.OpenPostgresDSN(t, faultDSN(t, pg.DSN, "application_name", app))
		store, err := infrastructure.NewGormEventStore(db)
		require.NoError(t, err)
		cps, err := subscriptions.NewGormCheckpointStore(db)
		require.NoError(t, err)
		logger, logs := newLogger()
		sub, err := subscriptions.NewSubscriber(name, store, cps, handler,
			subscriptions.WithPartitions(parts), subscriptions.WithConcurrency(workers),
			subscriptions.WithBatchSize(10), subscriptions.WithPollInterval(50*time.Millisecond), subscriptions.WithLogger(logger))
		require.NoError(t, err)
		rig.subs = append(rig.subs, sub)
		rig.logs = append(rig.logs, logs)
		rig.runs = append(rig.runs, start(t, sub))
	}
	return rig
}

// faultPartBacklog appends n events round-robin over aggs aggregates, so
// that every partition has work.
func faultPartBacklog(t *testing.T, store domain.EventStore, n, aggs int) {
	t.Helper()
	for i := 0; i < n; i++ {
		agg := fmt.Sprintf("fault-part-agg-%d", i%aggs)
		ev := domain.NewEventEnvelope[any](map[string]any{"i": i}, agg, "fault.parts", 0)
		require.NoError(t, store.Append(context.Background(), agg, -1, ev))
	}
}

// requireAlive requires that no replica's Run has returned.
func (rig *faultPartRig) requireAlive(t *testing.T) {
	t.Helper()
	for i, r := range rig.runs {
		if r.returned() {
			res := r.wait(t)
			t.Fatalf("replica %d's Run returned (%v, panic %v)", i, res.err, res.panicVal)
		}
	}
}

// finish waits until no partition is behind, stops the replicas and checks
// the projection: every event of the feed handled exactly once (committed),
// per aggregate in feed order.
func (rig *faultPartRig) finish(t *testing.T, what string) {
	t.Helper()
	ctx := context.Background()
	require.Eventually(t, func() bool {
		lags, err := rig.subs[0].PartitionLags(ctx)
		if err != nil {
			return false
		}
		for _, l := range lags {
			if l != 0 {
				return false
			}
		}
		return true
	}, 2*time.Minute, 20*time.Millisecond, "%s: partitions left behind", what)
	rig.requireAlive(t)
	for _, r := range rig.runs {
		r.stop(t)
	}
	lags, err := rig.subs[0].PartitionLags(ctx)
	require.NoError(t, err)
	require.Equal(t, make([]int64, rig.parts), lags, "%s: no partition left behind", what)

	var rows []struct {
		EventID   string
		Agg       string
		Position  int64
		Handled   int
		HandledAt int64
	}
	require.NoError(t, rig.admin.Raw("SELECT event_id, agg, position, handled, handled_at FROM "+rig.table+" ORDER BY agg, position").Scan(&rows).Error)
	ids := make([]string, 0, len(rows))
	for i, r := range rows {
		require.Equal(t, 1, r.Handled, "%s: event %s (position %d) handled %d times", what, r.EventID, r.Position, r.Handled)
		ids = append(ids, r.EventID)
		if i > 0 && rows[i-1].Agg == r.Agg {
			require.Greater(t, r.HandledAt, rows[i-1].HandledAt, "%s: aggregate %s: position %d handled before position %d",
				what, r.Agg, r.Position, rows[i-1].Position)
		}
	}
	faultRequireExactlyOnce(t, what+": projection", ids, faultFeedIDs(t, rig.events))
	rig.mu.Lock()
	defer rig.mu.Unlock()
	require.Empty(t, rig.violations, "%s: per-aggregate order", what)
	for i, logs := range rig.logs {
		require.NotContains(t, logs.String(), "panic", "%s: replica %d", what, i)
	}
}

// TestFaultPartitionTerminatedBackends: three replicas of a partitioned
// subscriber (8 partitions, 2 workers each, a pool each) run while a
// writer appends, and every backend of their pools is terminated
// (pg_terminate_backend) at random moments (6 outages, 60 in the long
// form). Run survives; afterwards every event is handled exactly once, in
// feed order per aggregate, and no partition is left behind.
func TestFaultPartitionTerminatedBackends(t *testing.T) {
	t.Parallel()
	pg := dbtest.NewPostgres(t)
	app := faultAppName()
	faultPartBacklog(t, mustGormEvents(t, pg.DB), 480, 24)
	rig := faultNewPartRig(t, pg, app, "fault-parts-term", "fault_parts_term", 8, 3, 2)
	w := faultStartWriter(t, rig.events, "fault.parts.live", 10*time.Millisecond, 3, 1_000_000)

	rng := faultRand(t)
	outages, terminated := faultScale(6, 60), 0
	for i := 0; i < outages; i++ {
		time.Sleep(time.Duration(50+rng.IntN(400)) * time.Millisecond)
		terminated += faultTerminate(t, pg.DB, app)
		rig.requireAlive(t)
	}
	appended, failures, last := w.stop()
	require.Zero(t, failures, "the writer's appends failed (last: %v)", last)
	require.Positive(t, terminated, "no backend of the replicas was terminated")
	errorLines := 0
	for _, logs := range rig.logs {
		errorLines += strings.Count(logs.String(), "level=ERROR")
	}
	require.Positive(t, errorLines, "no replica logged a failure: the outages hit nothing")
	rig.finish(t, "terminated backends")
	t.Logf("%d outages, %d backends terminated, %d replica error lines, %d events (%d live)",
		outages, terminated, errorLines, 480+len(appended), len(appended))
}

// TestFaultPartitionResetWhileRunning: three replicas of a partitioned
// subscriber (8 partitions, 2 workers each, a pool each) run while a
// writer appends, and the test rebuilds from a random position at random
// moments (twice, 40 times in the long form) at or below the position every
// partition has reached: ResetCheckpointWith deletes the projection's rows
// past the position and moves every partition there in one transaction,
// against the batches in flight. Afterwards every event
// is in the projection exactly once (the rows past a reset position were
// deleted with it and handled once since), in feed order per aggregate,
// and no partition is left behind.
func TestFaultPartitionResetWhileRunning(t *testing.T) {
	t.Parallel()
	pg := dbtest.NewPostgres(t)
	faultPartBacklog(t, mustGormEvents(t, pg.DB), 480, 24)
	rig := faultNewPartRig(t, pg, faultAppName(), "fault-parts-reset", "fault_parts_reset", 8, 3, 2)
	w := faultStartWriter(t, rig.events, "fault.parts.live", 10*time.Millisecond, 3, 1_000_000)

	ctx := context.Background()
	rng := faultRand(t)
	resets := faultScale(2, 40)
	var positions []int64
	prev := int64(0)
	for i := 0; i < resets; i++ {
		time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
		// A rebuild keeps the rows at or below p and says every event there
		// is handled: p must not pass an event some partition has not
		// handled yet (since the last reset), so it is drawn at or below
		// Status's Position, the position every partition has reached.
		// It waits until they have got past the last reset position, so
		// that the resets land at different places.
		var st subscriptions.Status
		require.Eventually(t, func() bool {
			var err error
			st, err = rig.subs[0].Status(ctx)
			return err == nil && st.Position > prev
		}, time.Minute, 10*time.Millisecond, "the partitions did not get past position %d", prev)
		p := rng.Int64N(st.Position + 1)
		prev = p
		sub := rig.subs[rng.IntN(len(rig.subs))]
		require.NoError(t, sub.ResetCheckpointWith(ctx, p, func(ctx context.Context) error {
			return subscriptions.TxFromContext(ctx).Exec("DELETE FROM "+rig.table+" WHERE position > ?", p).Error
		}), "reset %d to %d", i, p)
		positions = append(positions, p)
		rig.requireAlive(t)
	}
	appended, failures, last := w.stop()
	require.Zero(t, failures, "the writer's appends failed (last: %v)", last)
	rig.finish(t, "reset while running")
	t.Logf("%d resets (to %v), %d events (%d live)", resets, positions, 480+len(appended), len(appended))
}

func mustGormEvents(t *testing.T, db *gorm.DB) domain.EventStore {
	t.Helper()
	store, err := infrastructure.NewGormEventStore(db)
	require.NoError(t, err)
	return store
}
