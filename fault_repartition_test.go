package subscriptions_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestFaultRepartitionKilledMidway: three child processes (GORM and
// pgxstore alternately) run a subscriber with 4 partitions over Postgres
// while events arrive. A fourth process repartitions the name to 6 and is
// SIGKILLed by its own handler in the middle of the catch-up, holding
// every partition: the old layout stands and the three go on. A second
// repartition succeeds; the three stop with ErrPartitionsChanged, three
// processes with 6 partitions take over, appends going on. At the end
// every event is in the projection exactly once, each aggregate's in feed
// order, and no partition is left behind.
func TestFaultRepartitionKilledMidway(t *testing.T) {
	t.Parallel()
	bin := faultBuildChild(t)
	pg := dbtest.NewPostgres(t)
	db := pg.DB
	const name, table = "fault-repart", "fault_repart_proj"
	events, err := infrastructure.NewGormEventStore(db)
	require.NoError(t, err)
	faultCreateChildProjection(t, db, table)
	// A backlog over 24 aggregates, handled slowly, so that the partitions
	// are at different places when the repartitions come.
	faultPartBacklog(t, events, 1500, 24)
	args := func(i int, extra ...string) []string {
		return append([]string{"-driver", []string{"postgres", "pgx"}[i%2], "-dsn", pg.DSN, "-name", name, "-batch", "10",
			"-poll", "50ms", "-table", table, "-delay", "3ms"}, extra...)
	}
	partitioned := func(i, n int) []string {
		return args(i, "-listen", "-partitions", fmt.Sprint(n), "-concurrency", "2")
	}
	w := faultStartWriter(t, events, "fault.repart.live", 10*time.Millisecond, 3, 1_000_000)
	old := make([]*faultChild, 3)
	for i := range old {
		old[i] = faultStartChild(t, bin, partitioned(i, 4)...)
		old[i].waitReady(t)
	}
	projected := func() int {
		var n int
		require.NoError(t, db.Raw("SELECT count(*) FROM "+table).Scan(&n).Error)
		return n
	}
	require.Eventually(t, func() bool { return projected() >= 200 }, time.Minute, 10*time.Millisecond, "the replicas make progress")

	// Killed in the middle of the catch-up, every partition held.
	killed := faultStartChild(t, bin, args(3, "-repartition", "6", "-kill-after", "3")...)
	select {
	case <-killed.done:
	case <-time.After(time.Minute):
		t.Fatalf("the repartition did not end:\n%s", killed.out)
	}
	var exitErr *exec.ExitError
	require.True(t, errors.As(killed.err, &exitErr), "the repartition was not killed (%v): it had fewer than 3 events to catch up?\n%s", killed.err, killed.out)
	ws, ok := exitErr.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "ended with %v:\n%s", killed.err, killed.out)
	require.Contains(t, killed.out.String(), "KILLER")
	require.EqualValues(t, 4, faultCheckpoint(t, db, name+"/partitions"), "the old layout stands")
	for p := range 6 {
		require.Zero(t, faultCheckpoint(t, db, fmt.Sprintf("%s/partition-%d-of-6", name, p)), "no row of the new layout")
	}
	before := projected()
	require.Eventually(t, func() bool { return projected() > before+20 }, time.Minute, 10*time.Millisecond, "the old replicas go on")
	for i, c := range old {
		require.False(t, c.exited(), "replica %d stopped:\n%s", i, c.out)
	}

	done := faultStartChild(t, bin, args(4, "-repartition", "6")...)
	done.waitExit(t)
	require.Contains(t, done.out.String(), "REPARTITIONED")
	for i, c := range old {
		select {
		case <-c.done:
		case <-time.After(30 * time.Second):
			t.Fatalf("replica %d of the old layout did not stop:\n%s", i, c.out)
		}
		require.Error(t, c.err, "replica %d", i)
		require.Contains(t, c.out.String(), subscriptions.ErrPartitionsChanged.Error(), "replica %d stops with ErrPartitionsChanged", i)
		faultRequireCleanOutput(t, c.out.String())
	}
	next := make([]*faultChild, 3)
	for i := range next {
		next[i] = faultStartChild(t, bin, partitioned(i, 6)...)
	}
	for _, c := range next {
		c.waitReady(t)
	}
	from := w.count()
	require.Eventually(t, func() bool { return w.count() >= from+30 }, time.Minute, 5*time.Millisecond, "appends go on under the new layout")
	appended, failures, last := w.stop()
	require.Zero(t, failures, "the writer's appends failed (last: %v)", last)
	require.NotEmpty(t, appended)

	watch, err := subscriptions.NewSubscriber(name, events, mustGormCheckpoints(t, db), func(context.Context, domain.EventEnvelope[any]) error { return nil },
		subscriptions.WithPartitions(6))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		lag, err := watch.Lag(context.Background())
		return err == nil && lag == 0
	}, 2*time.Minute, 20*time.Millisecond, "no partition may be left behind")
	for _, c := range next {
		c.term(t)
		faultRequireCleanOutput(t, c.out.String())
	}
	feed := faultFeedIDs(t, events)
	faultRequireExactlyOnce(t, "repartitioned projection", faultProjectedIDs(t, db, table), feed)
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
	t.Logf("%d events (%d live); the killed repartition:\n%s", len(feed), len(appended), killed.out)
}

func mustGormCheckpoints(t *testing.T, db *gorm.DB) subscriptions.CheckpointStore {
	t.Helper()
	cps, err := subscriptions.NewGormCheckpointStore(db)
	require.NoError(t, err)
	return cps
}
