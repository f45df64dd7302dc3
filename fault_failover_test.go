package subscriptions_test

import (
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestFaultFailover runs three replicas of one subscriber (same name) as
// child processes on Postgres, on the GORM backend and pgxstore's
// alternately, while the parent appends events steadily,
// and repeatedly SIGKILLs the active replica — the one whose process wrote
// the latest projection row — starting a fresh replica for each one killed.
// Every event is handled exactly once across all replicas, and the longest
// gap in processing after a kill stays within one poll interval plus
// faultRecoverySlack. The replicas poll (no LISTEN/NOTIFY wake-ups, which the crash
// loop exercises): the takeover then rests on polling alone, the worst
// case the bound is about.
func TestFaultFailover(t *testing.T) {
	const (
		name     = "fault-failover"
		table    = "fault_failover_proj"
		replicas = 3
		poll     = 200 * time.Millisecond
	)
	t.Parallel()
	bin := faultBuildChild(t)
	pg := dbtest.NewPostgres(t)
	db := pg.DB
	events, err := infrastructure.NewGormEventStore(db)
	require.NoError(t, err)
	_, err = subscriptions.NewGormCheckpointStore(db)
	require.NoError(t, err)
	faultCreateChildProjection(t, db, table)

	rng := faultRand(t)
	kills := faultScale(5, 60)
	// Replicas alternate between the GORM backend and pgxstore's: one
	// subscriber name, both kinds of process.
	started := 0
	args := func() []string {
		started++
		return []string{"-driver", []string{"postgres", "pgx"}[started%2], "-dsn", pg.DSN, "-name", name, "-batch", "10",
			"-poll", poll.String(), "-table", table, "-delay", "500us"}
	}

	children := map[int]*faultChild{}
	var outputs []string
	startReplica := func() {
		c := faultStartChild(t, bin, args()...)
		children[c.pid] = c
	}
	for range replicas {
		startReplica()
	}
	for _, c := range children {
		c.waitReady(t)
	}

	w := faultStartWriter(t, events, "fault.failover", 10*time.Millisecond, 1, 1_000_000)
	var gaps []time.Duration
	pids := map[int64]bool{}
	for i := 0; i < kills; i++ {
		// Pick the active replica at a random moment, with at least one
		// other replica ready to take over (the newest may still be
		// starting).
		require.Eventually(t, func() bool {
			ready := 0
			for _, c := range children {
				select {
				case <-c.out.ready:
					ready++
				default:
				}
			}
			return ready >= 2
		}, time.Minute, 5*time.Millisecond, "fewer than two replicas ready")
		time.Sleep(time.Duration(50+rng.IntN(300)) * time.Millisecond)
		var active *faultChild
		require.Eventually(t, func() bool {
			pid := faultLatestPID(t, db, table)
			active = children[int(pid)]
			return active != nil
		}, 30*time.Second, 5*time.Millisecond, "no live replica has committed anything")

		killed := time.Now()
		active.kill(t)
		delete(children, active.pid)
		outputs = append(outputs, active.out.String())
		startReplica()

		// The gap: from the kill to the first event a surviving replica
		// handled (and committed) after it.
		var first int64
		require.Eventually(t, func() bool {
			first = faultFirstHandledAfter(t, db, table, killed.UnixNano())
			return first != 0
		}, 30*time.Second, 5*time.Millisecond, "nothing was processed after killing replica %d", active.pid)
		gap := time.Duration(first - killed.UnixNano())
		gaps = append(gaps, gap)
	}
	appended, failures, last := w.stop()
	require.Zero(t, failures, "the writer's appends failed (last: %v)", last)

	faultWaitCheckpointAtHead(t, db, events, name, time.Minute)
	for _, c := range children {
		c.waitReady(t)
		require.NoError(t, c.cmd.Process.Signal(syscall.SIGTERM))
	}
	for _, c := range children {
		c.waitExit(t)
		outputs = append(outputs, c.out.String())
	}
	faultRequireCleanOutput(t, outputs...)

	feed := faultFeedIDs(t, events)
	faultRequireExactlyOnce(t, "writer's appends in the feed", feed, appended)
	faultRequireExactlyOnce(t, "failover projection", faultProjectedIDs(t, db, table), feed)
	var writers []int64
	require.NoError(t, db.Raw("SELECT DISTINCT pid FROM "+table).Scan(&writers).Error)
	for _, p := range writers {
		pids[p] = true
	}

	longest := slices.Max(gaps)
	sorted := slices.Clone(gaps)
	slices.Sort(sorted)
	t.Logf("failover: %d kills of the active replica, %d processes wrote the projection, %d events; gaps after a kill: longest %v, median %v, all %v",
		kills, len(pids), len(feed), longest.Round(time.Millisecond), sorted[len(sorted)/2].Round(time.Millisecond), faultRound(gaps))
	require.Greater(t, len(pids), 1, "only one replica ever processed: the kills did not fail over")
	require.LessOrEqual(t, longest, poll+faultRecoverySlack, "the longest processing gap after a kill waited for more than the next poll (see faultRecoverySlack)")
}

// faultLatestPID returns the pid of the process that wrote the projection
// row with the highest position (0 when there is none).
func faultLatestPID(t testing.TB, db *gorm.DB, table string) int64 {
	t.Helper()
	var pids []int64
	require.NoError(t, db.Raw("SELECT pid FROM "+table+" ORDER BY position DESC LIMIT 1").Scan(&pids).Error)
	if len(pids) == 0 {
		return 0
	}
	return pids[0]
}

// faultFirstHandledAfter returns the earliest handling time (Unix
// nanoseconds) after since among committed projection rows, 0 when none.
func faultFirstHandledAfter(t testing.TB, db *gorm.DB, table string, since int64) int64 {
	t.Helper()
	var first []int64
	require.NoError(t, db.Raw("SELECT handled_at FROM "+table+" WHERE handled_at > ? ORDER BY handled_at LIMIT 1", since).Scan(&first).Error)
	if len(first) == 0 {
		return 0
	}
	return first[0]
}

// faultRound rounds durations to the millisecond for logging.
func faultRound(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}
