package subscriptions_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestFaultCrashLoop is the promise "crash recovery is just startup": a
// child process runs a subscriber that projects every event through the
// batch transaction while the parent appends events, and the parent
// SIGKILLs the child at random moments (during startup, mid-batch, idle)
// and starts it again — 20 times in the short form, 200 in the long one.
// After a last child has run to completion, the projection holds every
// appended event exactly once and the checkpoint equals the feed head.
func TestFaultCrashLoop(t *testing.T) {
	t.Parallel()
	bin := faultBuildChild(t)
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		pg := dbtest.NewPostgres(t)
		faultCrashLoop(t, bin, "postgres", pg.DSN, pg.DB)
	})
	t.Run("postgres-pgx", func(t *testing.T) {
		t.Parallel()
		pg := dbtest.NewPostgres(t)
		faultCrashLoop(t, bin, "pgx", pg.DSN, pg.DB)
	})
	t.Run("sqlite-file", func(t *testing.T) {
		t.Parallel()
		dsn := dbtest.SQLiteFileDSN(filepath.Join(t.TempDir(), "crash.db"))
		faultCrashLoop(t, bin, "sqlite", dsn, dbtest.OpenSQLite(t, dsn))
	})
	t.Run("sqlite-file-glebarez", func(t *testing.T) {
		t.Parallel()
		dsn := dbtest.Glebarez.FileDSN(filepath.Join(t.TempDir(), "crash.db"))
		faultCrashLoop(t, bin, "glebarez", dsn, dbtest.Glebarez.OpenDSN(t, dsn))
	})
}

func faultCrashLoop(t *testing.T, bin, driver, dsn string, db *gorm.DB) {
	const name, table = "fault-crash", "fault_crash_proj"
	events, err := infrastructure.NewGormEventStore(db)
	require.NoError(t, err)
	_, err = subscriptions.NewGormCheckpointStore(db) // the parent reads the table before any child exists
	require.NoError(t, err)
	faultCreateChildProjection(t, db, table)

	rng := faultRand(t)
	kills := faultScale(20, 200)
	args := []string{"-driver", driver, "-dsn", dsn, "-name", name, "-batch", "20", "-poll", "50ms", "-table", table}
	if driver == "postgres" || driver == "pgx" {
		args = append(args, "-listen")
	}

	w := faultStartWriter(t, events, "fault.crash", 15*time.Millisecond, 3, 1_000_000)
	loopStart := time.Now()
	var backlogged, advanced, duringStartup int
	for i := 0; i < kills; i++ {
		before := faultCheckpoint(t, db, name)
		c := faultStartChild(t, bin, args...)
		if rng.IntN(4) == 0 {
			// Anywhere, startup included.
			duringStartup++
			time.Sleep(time.Duration(rng.IntN(150)) * time.Millisecond)
		} else {
			c.waitReady(t)
			time.Sleep(time.Duration(rng.IntN(250)) * time.Millisecond)
		}
		if faultCheckpoint(t, db, name) < faultHead(t, events) {
			backlogged++ // there was work in flight or waiting when the kill came
		}
		c.kill(t)
		if faultCheckpoint(t, db, name) > before {
			advanced++
		}
		faultRequireCleanOutput(t, c.out.String())
	}
	appended, failures, last := w.stop()
	require.Zero(t, failures, "the writer's appends failed (last: %v)", last)
	require.Positive(t, advanced, "no child ever committed a batch before it was killed: the kills hit nothing")

	loop := time.Since(loopStart)
	finalStart := time.Now()
	final := faultStartChild(t, bin, args...)
	final.waitReady(t)
	faultWaitCheckpointAtHead(t, db, events, name, 2*time.Minute)
	final.term(t)
	catchUp := time.Since(finalStart)
	faultRequireCleanOutput(t, final.out.String())

	feed := faultFeedIDs(t, events)
	faultRequireExactlyOnce(t, driver+": writer's appends in the feed", feed, appended)
	faultRequireExactlyOnce(t, driver+": projection", faultProjectedIDs(t, db, table), feed)
	require.Equal(t, faultHead(t, events), faultCheckpoint(t, db, name))
	t.Logf("%s: %d kills survived (%d with a backlog, %d possibly during startup, %d after the checkpoint had advanced), %d events; kill loop %v, final run %v",
		driver, kills, backlogged, duringStartup, advanced, len(feed), loop.Round(time.Millisecond), catchUp.Round(time.Millisecond))
}

// TestFaultCrashLoopKillerEvent: a handler that SIGKILLs its own process
// on one event (a crash no deferred code sees: OOM, a segfault in cgo) is
// parked after 1 + WithMaxRetries runs of it alone, plus the first, inside
// a batch of several events, which is charged to none; each restart
// continues the count, and every other event is projected exactly once.
// Before attempts were counted in the database, every restart counted from
// zero: a crash loop forever.
func TestFaultCrashLoopKillerEvent(t *testing.T) {
	t.Parallel()
	bin := faultBuildChild(t)
	for _, c := range []struct{ name, driver string }{{"postgres", "postgres"}, {"postgres-pgx", "pgx"}, {"sqlite-file", "sqlite"}, {"sqlite-file-glebarez", "glebarez"}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var dsn string
			var db *gorm.DB
			switch c.driver {
			case "postgres", "pgx":
				pg := dbtest.NewPostgres(t)
				dsn, db = pg.DSN, pg.DB
			case "sqlite":
				dsn = dbtest.SQLiteFileDSN(filepath.Join(t.TempDir(), "killer.db"))
				db = dbtest.OpenSQLite(t, dsn)
			default:
				dsn = dbtest.Glebarez.FileDSN(filepath.Join(t.TempDir(), "killer.db"))
				db = dbtest.Glebarez.OpenDSN(t, dsn)
			}
			faultKillerEvent(t, bin, c.driver, dsn, db)
		})
	}
}

func faultKillerEvent(t *testing.T, bin, driver, dsn string, db *gorm.DB) {
	const name, table, maxRetries = "fault-killer", "fault_killer_proj", 2
	events, err := infrastructure.NewGormEventStore(db)
	require.NoError(t, err)
	_, err = subscriptions.NewGormCheckpointStore(db)
	require.NoError(t, err)
	faultCreateChildProjection(t, db, table)
	lot, err := subscriptions.NewGormParkingLot(db)
	require.NoError(t, err)

	ctx := context.Background()
	var others []string
	var killer domain.EventEnvelope[any]
	for i := range 9 {
		typ := "fault.ok"
		if i == 4 {
			typ = "fault.killer"
		}
		ev := domain.NewEventEnvelope[any](map[string]any{"i": i}, fmt.Sprintf("killer-%d", i), typ, 0)
		require.NoError(t, events.Append(ctx, ev.AggregateID, 0, ev))
		if i == 4 {
			killer = ev
		} else {
			others = append(others, ev.ID)
		}
	}

	args := []string{"-driver", driver, "-dsn", dsn, "-name", name, "-batch", "20", "-poll", "20ms", "-table", table,
		"-kill-type", "fault.killer", "-park-retries", fmt.Sprint(maxRetries)}
	want := 2 + maxRetries // the batch's crash, then 1 + maxRetries alone
	for start := 1; start <= want; start++ {
		c := faultStartChild(t, bin, args...)
		select {
		case <-c.done:
		case <-time.After(2 * time.Minute):
			t.Fatalf("start %d: the child did not die within 2 minutes:\n%s", start, c.out)
		}
		require.Contains(t, c.out.String(), "KILLER event "+killer.ID, "start %d: the child ended without running the killer event:\n%s", start, c.out)
		faultRequireCleanOutput(t, c.out.String())
	}
	final := faultStartChild(t, bin, args...)
	final.waitReady(t)
	faultWaitCheckpointAtHead(t, db, events, name, 2*time.Minute)
	final.term(t)
	require.NotContains(t, final.out.String(), "KILLER", "the parked event ran again")
	faultRequireCleanOutput(t, final.out.String())

	parked, err := lot.List(ctx, name)
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, killer.ID, parked[0].EventID)
	require.Equal(t, 1+maxRetries, parked[0].Attempts)
	require.Contains(t, parked[0].Error, "without completing")
	faultRequireExactlyOnce(t, driver+": projection", faultProjectedIDs(t, db, table), others)
}
