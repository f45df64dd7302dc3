package subscriptions_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestFaultPartitionCrashLoop: three child processes run one partitioned
// subscriber (8 partitions, 2 workers each) over Postgres while events
// arrive, and the parent SIGKILLs a random one at random moments and
// starts it again (12 kills in the short form, 120 in the long one). At
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
	args := []string{"-driver", "postgres", "-dsn", pg.DSN, "-name", name, "-batch", "10", "-poll", "50ms", "-table", table,
		"-listen", "-partitions", fmt.Sprint(parts), "-concurrency", "2", "-delay", "1ms"}
	w := faultStartWriter(t, events, "fault.parts.live", 15*time.Millisecond, 3, 1_000_000)

	rng := faultRand(t)
	children := make([]*faultChild, 3)
	for i := range children {
		children[i] = faultStartChild(t, bin, args...)
	}
	kills := faultScale(12, 120)
	for k := 0; k < kills; k++ {
		i := rng.IntN(len(children))
		if rng.IntN(3) > 0 {
			children[i].waitReady(t)
		}
		time.Sleep(time.Duration(rng.IntN(200)) * time.Millisecond)
		children[i].kill(t)
		faultRequireCleanOutput(t, children[i].out.String())
		children[i] = faultStartChild(t, bin, args...)
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
