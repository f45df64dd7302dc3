package subscriptions_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// wakePassword is the password in every DSN whose logs and errors are
// checked: it must never appear in either.
const wakePassword = "s3cr3tPassw0rd"

// wakeClosedPortDSN points at a port where no server listens.
const wakeClosedPortDSN = "postgres://postgres:" + wakePassword + "@127.0.0.1:1/test?sslmode=disable"

// wakeAppDSN returns dsn with an application_name unique to the test, so
// that the listener's backend can be found in pg_stat_activity even while
// other tests' connections come and go.
func wakeAppDSN(t *testing.T, pg *dbtest.Postgres) (dsn, appName string) {
	t.Helper()
	u, err := url.Parse(pg.DSN)
	require.NoError(t, err)
	appName = "wake_" + pg.Schema
	q := u.Query()
	q.Set("application_name", appName)
	u.RawQuery = q.Encode()
	return u.String(), appName
}

// wakeBackend is a row of pg_stat_activity.
type wakeBackend struct {
	PID             int `gorm:"column:pid"`
	ApplicationName string
	Query           string
}

// wakeBackends returns the backends with the given application_name.
func wakeBackends(t *testing.T, db *gorm.DB, appName string) []wakeBackend {
	t.Helper()
	var rows []wakeBackend
	require.NoError(t, db.Raw(`SELECT pid, application_name, query FROM pg_stat_activity
		WHERE application_name = ? AND pid <> pg_backend_pid()`, appName).Scan(&rows).Error)
	return rows
}

// wakeListenerPID waits for the one backend with appName that is
// LISTENing and returns its PID.
func wakeListenerPID(t *testing.T, db *gorm.DB, appName string) int {
	t.Helper()
	var pid int
	require.Eventually(t, func() bool {
		rows := wakeBackends(t, db, appName)
		if len(rows) != 1 || !strings.HasPrefix(rows[0].Query, "LISTEN") {
			return false
		}
		pid = rows[0].PID
		return true
	}, wakeBound, 5*time.Millisecond, "no LISTEN connection with application_name %q", appName)
	return pid
}

// wakeNoSignal is a short, bounded negative check: ch receives nothing for
// d.
func wakeNoSignal(t *testing.T, ch <-chan struct{}, d time.Duration, why string) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ch:
		t.Fatalf("unexpected wake signal: %s", why)
	case <-timer.C:
	}
}

// wakeNotifier returns a func that NOTIFYs channel through db, failing the
// test on error.
func wakeNotifier(t *testing.T, db *gorm.DB, channel string) func() {
	return func() {
		t.Helper()
		require.NoError(t, db.Exec("SELECT pg_notify(?, '')", channel).Error)
	}
}

// TestPostgresListenerReconnectsAfterConnectionKilled: when its backend is
// terminated, the listener logs the loss, waits its reconnect delay,
// LISTENs again on a new connection, sends every subscriber one wake
// signal for what may have committed meanwhile, and relays NOTIFYs again —
// including to a channel subscribed while it runs.
//
// The listener uses a channel of its own, so that other tests' appends on
// the shared database (which NOTIFY the default channel) cannot stand in
// for the signals checked here.
func TestPostgresListenerReconnectsAfterConnectionKilled(t *testing.T) {
	const delay = 100 * time.Millisecond
	pg := dbtest.NewPostgres(t)
	e := gormEnv(t, "postgres", pg.DB, pg)
	otherDB := pg.Open(t)
	other, err := infrastructure.NewGormEventStore(otherDB)
	require.NoError(t, err)
	dsn, appName := wakeAppDSN(t, pg)
	channel := "wake_reconnect_" + pg.Schema
	notify := wakeNotifier(t, otherDB, channel)

	logger, logs := newLogger()
	listener, err := subscriptions.NewPostgresListener(dsn, subscriptions.WithListenerLogger(logger),
		subscriptions.WithListenerReconnectDelay(delay), subscriptions.WithListenerChannel(channel))
	require.NoError(t, err)
	probe := listener.Subscribe()
	counting := &wakeCountingStore{EventStore: e.Events}
	handled := newWakeHandled(8)
	sub, err := subscriptions.NewSubscriber("wake-reconnect", counting, e.Checkpoints, handled.handler("wake-reconnect"),
		subscriptions.WithPollInterval(wakePoll), subscriptions.WithWakeSignal(listener.Subscribe()),
		subscriptions.WithLogger(quietLogger()))
	require.NoError(t, err)

	wakeRunListener(t, listener)
	wakeWaitLog(t, logs, "postgres listener: listening", 1)
	wakeRecv(t, probe, "the wake signal sent on connecting")
	pid := wakeListenerPID(t, pg.DB, appName)
	start(t, sub)
	latencies := wakeLatencies(t, other, counting, handled, 1, true, notify)
	t.Logf("before the kill: %v", latencies)
	wakeRecv(t, probe, "the NOTIFY before the kill")
	wakeNoSignal(t, probe, 50*time.Millisecond, "only one NOTIFY was sent")

	var terminated []bool
	killedAt := time.Now()
	require.NoError(t, pg.DB.Raw("SELECT pg_terminate_backend(?::integer)", pid).Pluck("pg_terminate_backend", &terminated).Error)
	require.Equal(t, []bool{true}, terminated, "pg_terminate_backend(%d)", pid)

	wakeWaitLog(t, logs, "postgres listener: connection lost; reconnecting", 1)
	wakeWaitLog(t, logs, "postgres listener: listening", 2)
	newPID := wakeListenerPID(t, pg.DB, appName)
	reconnected := time.Since(killedAt)
	require.NotEqual(t, pid, newPID, "a new connection")
	require.GreaterOrEqual(t, reconnected, delay, "the listener waits its reconnect delay before reconnecting")
	t.Logf("listening again %v after the kill (reconnect delay %v)", reconnected, delay)
	wakeRecv(t, probe, "the wake signal sent on reconnecting")
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "connection lost") {
			t.Logf("%s", line)
		}
	}
	require.Contains(t, logs.String(), "retry_in=100ms")
	require.Contains(t, logs.String(), "consecutive_failures=1")

	late := listener.Subscribe()
	latencies = wakeLatencies(t, other, counting, handled, 3, true, notify)
	t.Logf("after the reconnect: %v", latencies)
	wakeRecv(t, late, "a NOTIFY on a channel subscribed while Run runs")
	wakeRecv(t, probe, "a NOTIFY after the reconnect")
	require.NotContains(t, logs.String(), "level=ERROR")
}

// TestPostgresListenerServerDownAtStart: a server that is down when Run
// starts is not an error: Run keeps retrying at its reconnect delay,
// logging each failure (without the password), subscribers wired to it
// keep making progress by polling, and cancellation returns nil.
func TestPostgresListenerServerDownAtStart(t *testing.T) {
	logger, logs := newLogger()
	listener, err := subscriptions.NewPostgresListener(wakeClosedPortDSN, subscriptions.WithListenerLogger(logger),
		subscriptions.WithListenerReconnectDelay(50*time.Millisecond))
	require.NoError(t, err, "a server that is down is not NewPostgresListener's concern")

	store := infrastructure.NewMemoryStore()
	handled := newWakeHandled(4)
	sub, err := subscriptions.NewSubscriber("wake-down", store, subscriptions.NewMemoryCheckpointStore(), handled.handler("wake-down"),
		subscriptions.WithPollInterval(100*time.Millisecond), subscriptions.WithWakeSignal(listener.Subscribe()),
		subscriptions.WithLogger(quietLogger()))
	require.NoError(t, err)

	stop := wakeRunListener(t, listener)
	start(t, sub)
	wakeWaitLog(t, logs, "postgres listener: connecting failed; retrying", 3)
	ids := appendN(t, store, "wake.down", 0, 2)
	require.Equal(t, ids[0], handled.next(t).id, "subscribers poll while the listener is down")
	require.Equal(t, ids[1], handled.next(t).id)
	stop()

	out := logs.String()
	require.Contains(t, out, "connection refused")
	require.Contains(t, out, "retry_in=50ms")
	require.Contains(t, out, "server=postgres@127.0.0.1:1/test")
	require.NotContains(t, out, "postgres listener: listening")
	require.NotContains(t, out, wakePassword)
}

// TestPostgresListenerNeverRevealsPassword: whatever goes wrong — a
// malformed DSN, a closed port, a server that refuses the user, a password
// taken from PGPASSWORD — no error and no log line contains the password.
func TestPostgresListenerNeverRevealsPassword(t *testing.T) {
	dbtest.RequirePostgres(t)
	t.Setenv("PGPASSWORD", "env"+wakePassword)
	for _, dsn := range []string{
		wakeClosedPortDSN,
		"postgres://nosuchuser:" + wakePassword + "@127.0.0.1:5432/test?sslmode=disable",
		"postgres://nosuchuser@127.0.0.1:5432/test?sslmode=disable", // password from PGPASSWORD
		"host=127.0.0.1 port=1 user=postgres password='" + wakePassword + "' sslmode=disable",
		"postgres://postgres:" + wakePassword + "@127.0.0.1:5432/nosuchdatabase?sslmode=disable",
	} {
		t.Run(strings.ReplaceAll(dsn, wakePassword, "PW"), func(t *testing.T) {
			logger, logs := newLogger()
			listener, err := subscriptions.NewPostgresListener(dsn, subscriptions.WithListenerLogger(logger),
				subscriptions.WithListenerReconnectDelay(20*time.Millisecond))
			require.NoError(t, err)
			stop := wakeRunListener(t, listener)
			wakeWaitLog(t, logs, "postgres listener: connecting failed; retrying", 2)
			stop()
			out := logs.String()
			t.Logf("%s", strings.SplitN(out, "\n", 2)[0])
			require.NotContains(t, out, wakePassword)
			require.NotContains(t, out, "s3cr3t")
		})
	}
}

// TestPostgresListenerRejectsMalformedDSN: NewPostgresListener parses the
// DSN up front and names the problem, without the password; a channel name
// that could never be notified is refused too.
func TestPostgresListenerRejectsMalformedDSN(t *testing.T) {
	for _, dsn := range []string{
		"postgres://postgres:" + wakePassword + "@127.0.0.1:badport/test",
		"postgres://postgres:s3cr3t%zzPassw0rd@127.0.0.1:5432/test",
		"postgres://postgres:s3cr3t Passw0rd@127.0.0.1:5432/test",
		"postgres://postgres:s3cr3tPa@ss@127.0.0.1:xx/test",
		"postgres://postgres:s3cr3tPa/ss@127.0.0.1:5432/test",
		"postgres://po:stgres:" + wakePassword + "@127.0.0.1:5432/test?x=%",
		"postgres://postgres:" + wakePassword + "@[::1/test",
		"postgres://postgres:" + wakePassword + "@127.0.0.1:5432/test?connect_timeout=abc",
		"postgres:/postgres:" + wakePassword + "@127.0.0.1:5432/test",
		"host=127.0.0.1 password=" + wakePassword + " port=notaport",
		"host=127.0.0.1 password='s3cr3t Passw0rd' sslmode=bogus",
	} {
		t.Run("", func(t *testing.T) {
			listener, err := subscriptions.NewPostgresListener(dsn)
			require.Error(t, err)
			require.Nil(t, listener)
			t.Logf("%v", err)
			require.Contains(t, err.Error(), "invalid Postgres DSN")
			require.NotContains(t, err.Error(), "s3cr3t")
			require.NotContains(t, fmt.Sprintf("%+v %#v", err, err), "s3cr3t", "not even in the wrapped errors")
		})
	}

	ok := dbtest.DefaultPostgresDSN
	for _, channel := range []string{"", strings.Repeat("c", 64), "bad\x00channel"} {
		_, err := subscriptions.NewPostgresListener(ok, subscriptions.WithListenerChannel(channel))
		require.ErrorContains(t, err, "channel name")
	}
	_, err := subscriptions.NewPostgresListener(ok, subscriptions.WithListenerChannel(strings.Repeat("c", 63)))
	require.NoError(t, err, "63 bytes is Postgres's identifier limit")
}

// TestPostgresListenerCustomChannel: WithListenerChannel LISTENs on the
// given channel — a NOTIFY there wakes, one on the default channel (which
// the event store uses) does not — and a hostile name is only a strange
// channel name: it is quoted, not executed.
func TestPostgresListenerCustomChannel(t *testing.T) {
	for _, channel := range []string{"wake_custom", `x"; DROP TABLE events; --`} {
		t.Run(channel, func(t *testing.T) {
			pg := dbtest.NewPostgres(t)
			e := gormEnv(t, "postgres", pg.DB, pg)
			dsn, appName := wakeAppDSN(t, pg)
			channel := channel + "_" + pg.Schema // unique on the shared server

			logger, logs := newLogger()
			listener, err := subscriptions.NewPostgresListener(dsn, subscriptions.WithListenerChannel(channel),
				subscriptions.WithListenerLogger(logger))
			require.NoError(t, err)
			ch := listener.Subscribe()
			wakeRunListener(t, listener)
			wakeWaitLog(t, logs, "postgres listener: listening", 1)
			wakeRecv(t, ch, "the wake signal sent on connecting")
			wakeListenerPID(t, pg.DB, appName)
			rows := wakeBackends(t, pg.DB, appName)
			require.Equal(t, `LISTEN "`+strings.ReplaceAll(channel, `"`, `""`)+`"`, rows[0].Query)

			require.NoError(t, pg.DB.Exec("SELECT pg_notify(?, '')", infrastructure.PostgresNotifyChannel).Error)
			appendN(t, e.Events, "wake.custom", 0, 1) // the store NOTIFYs the default channel
			wakeNoSignal(t, ch, 300*time.Millisecond, "a NOTIFY on the default channel woke a listener on "+channel)

			require.NoError(t, pg.DB.Exec("SELECT pg_notify(?, '')", channel).Error)
			wakeRecv(t, ch, "a NOTIFY on the custom channel")

			head, err := e.Events.HeadPosition(context.Background())
			require.NoError(t, err, "the events table is still there")
			require.Equal(t, int64(1), head)
			require.NotContains(t, logs.String(), "level=WARN")
		})
	}
}

// TestPostgresListenerServesManySubscribers: one listener, 20 subscribers
// (each with its own Subscribe channel and name): one NOTIFY wakes all of
// them, long before their 1-hour poll. (A channel of the test's own, so
// that only this test's NOTIFY can wake them.)
func TestPostgresListenerServesManySubscribers(t *testing.T) {
	const n = 20
	pg := dbtest.NewPostgres(t)
	e := gormEnv(t, "postgres", pg.DB, pg)
	otherDB := pg.Open(t)
	other, err := infrastructure.NewGormEventStore(otherDB)
	require.NoError(t, err)
	channel := "wake_many_" + pg.Schema

	logger, logs := newLogger()
	listener, err := subscriptions.NewPostgresListener(pg.DSN, subscriptions.WithListenerLogger(logger),
		subscriptions.WithListenerChannel(channel))
	require.NoError(t, err)
	counting := &wakeCountingStore{EventStore: e.Events}
	handled := newWakeHandled(2 * n)
	subs := make([]*subscriptions.Subscriber, n)
	for i := range subs {
		name := fmt.Sprintf("wake-many-%02d", i)
		subs[i], err = subscriptions.NewSubscriber(name, counting, e.Checkpoints, handled.handler(name),
			subscriptions.WithPollInterval(wakePoll), subscriptions.WithWakeSignal(listener.Subscribe()),
			subscriptions.WithLogger(quietLogger()))
		require.NoError(t, err)
	}
	wakeRunListener(t, listener)
	wakeWaitLog(t, logs, "postgres listener: listening", 1)
	for _, sub := range subs {
		start(t, sub)
	}
	wakeQuiet(t, counting, 200*time.Millisecond, true)

	id, began := wakeAppendOne(t, other, 1)
	wakeNotifier(t, otherDB, channel)()
	seen := map[string]bool{}
	var slowest time.Duration
	for range n {
		got := handled.next(t)
		require.Equal(t, id, got.id)
		require.False(t, seen[got.sub], "%s handled the event twice", got.sub)
		seen[got.sub] = true
		slowest = max(slowest, got.at.Sub(began))
	}
	t.Logf("all %d subscribers handled the event within %v of the append", n, slowest)
	require.Len(t, seen, n)
}

// TestPostgresListenerDefaults: the default channel and application_name;
// a nil logger falls back to slog.Default() with the default reconnect
// delay; a reconnect delay <= 0 is refused, like every out-of-range option.
func TestPostgresListenerDefaults(t *testing.T) {
	require.Equal(t, 5*time.Second, subscriptions.DefaultListenerReconnectDelay)

	t.Run("channel and application_name", func(t *testing.T) {
		pg := dbtest.NewPostgres(t)
		dsn, appName := wakeAppDSN(t, pg)
		byDSN, err := subscriptions.NewPostgresListener(dsn, subscriptions.WithListenerLogger(quietLogger()))
		require.NoError(t, err)
		wakeRunListener(t, byDSN)
		wakeListenerPID(t, pg.DB, appName)
		require.Equal(t, `LISTEN "pericarp_events"`, wakeBackends(t, pg.DB, appName)[0].Query,
			"the default channel is infrastructure.PostgresNotifyChannel; the DSN's application_name is kept")

		channel := "wake_default_app_" + pg.Schema
		byDefault, err := subscriptions.NewPostgresListener(pg.DSN, subscriptions.WithListenerChannel(channel),
			subscriptions.WithListenerLogger(quietLogger()))
		require.NoError(t, err)
		wakeRunListener(t, byDefault)
		require.Eventually(t, func() bool {
			var n int64
			err := pg.DB.Raw(`SELECT count(*) FROM pg_stat_activity WHERE application_name = 'subscriptions-listener' AND query = ?`,
				`LISTEN "`+channel+`"`).Scan(&n).Error
			return err == nil && n == 1
		}, wakeBound, 5*time.Millisecond, "the listener's connection reports application_name subscriptions-listener")
	})

	t.Run("nil logger", func(t *testing.T) {
		logger, logs := newLogger()
		wakeSetDefaultLogger(t, logger)
		listener, err := subscriptions.NewPostgresListener(wakeClosedPortDSN, subscriptions.WithListenerLogger(nil))
		require.NoError(t, err)
		stop := wakeRunListener(t, listener)
		wakeWaitLog(t, logs, "postgres listener: connecting failed; retrying", 1)
		stop()
		require.Contains(t, logs.String(), "retry_in=5s", "the default delay is DefaultListenerReconnectDelay")
	})

	t.Run("non-positive delay is refused", func(t *testing.T) {
		for _, delay := range []time.Duration{0, -time.Second} {
			_, err := subscriptions.NewPostgresListener(wakeClosedPortDSN, subscriptions.WithListenerReconnectDelay(delay))
			require.ErrorContains(t, err, "WithListenerReconnectDelay", "delay %v", delay)
		}
	})
}

// wakeSetDefaultLogger makes logger slog's default for the test. The log
// package's output is restored too: slog.SetDefault redirects it.
func wakeSetDefaultLogger(t *testing.T, logger *slog.Logger) {
	old, oldWriter, oldFlags := slog.Default(), log.Writer(), log.Flags()
	slog.SetDefault(logger)
	t.Cleanup(func() {
		slog.SetDefault(old)
		log.SetOutput(oldWriter)
		log.SetFlags(oldFlags)
	})
}

// TestPostgresListenerRunLifecycle: Run returns nil on cancellation, closes
// its connection and leaves no goroutine behind; an already-cancelled
// context returns at once; a second concurrent Run is refused; a stopped
// listener can run again.
func TestPostgresListenerRunLifecycle(t *testing.T) {
	pg := dbtest.NewPostgres(t)
	dsn, appName := wakeAppDSN(t, pg)
	listener, err := subscriptions.NewPostgresListener(dsn, subscriptions.WithListenerLogger(quietLogger()))
	require.NoError(t, err)

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, listener.Run(cancelled))

	baseline := goleak.IgnoreCurrent()
	for round := range 2 {
		stop := wakeRunListener(t, listener)
		wakeListenerPID(t, pg.DB, appName)
		err := listener.Run(context.Background())
		require.ErrorContains(t, err, "already running", "round %d", round)
		stop()
		require.Eventually(t, func() bool { return len(wakeBackends(t, pg.DB, appName)) == 0 },
			wakeBound, 5*time.Millisecond, "Run closes its connection")
		goleak.VerifyNone(t, baseline)
	}
}

// TestPostgresChannelPerStore: two event stores in two schemas of one
// database, each subscribed to through its own listener. With a channel
// per store (infrastructure.WithNotifyChannel matched by
// WithListenerChannel), appends to one store never wake the other's
// subscriber: its feed reads stay at zero while the busy store's
// subscriber handles every event. The control case, both stores on one
// channel, shows that the count does see cross-schema wake-ups.
func TestPostgresChannelPerStore(t *testing.T) {
	const appends = 5
	for _, c := range []struct {
		name       string
		oneChannel bool
	}{
		{"own channels", false},
		{"one channel", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			quietPG, busyPG := dbtest.NewPostgres(t), dbtest.NewPostgres(t)
			quietChannel, busyChannel := "quiet_"+quietPG.Schema, "busy_"+busyPG.Schema
			if c.oneChannel {
				busyChannel = quietChannel
			}
			// Each side is one service: its store NOTIFYs its channel, its
			// listener LISTENs on it, its subscriber polls once a minute.
			side := func(pg *dbtest.Postgres, channel string, handled *wakeHandled) (domain.EventStore, *wakeCountingStore) {
				store, err := infrastructure.NewGormEventStore(pg.DB, infrastructure.WithNotifyChannel(channel))
				require.NoError(t, err)
				cps, err := subscriptions.NewGormCheckpointStore(pg.DB)
				require.NoError(t, err)
				logger, logs := newLogger()
				listener, err := subscriptions.NewPostgresListener(pg.DSN, subscriptions.WithListenerChannel(channel),
					subscriptions.WithListenerLogger(logger))
				require.NoError(t, err)
				counting := &wakeCountingStore{EventStore: store}
				sub, err := subscriptions.NewSubscriber("channel-"+pg.Schema, counting, cps, handled.handler(pg.Schema),
					subscriptions.WithPollInterval(wakePoll), subscriptions.WithWakeSignal(listener.Subscribe()),
					subscriptions.WithLogger(quietLogger()))
				require.NoError(t, err)
				wakeRunListener(t, listener)
				wakeWaitLog(t, logs, "postgres listener: listening", 1)
				start(t, sub)
				return store, counting
			}
			quietHandled, busyHandled := newWakeHandled(appends), newWakeHandled(appends)
			_, quiet := side(quietPG, quietChannel, quietHandled)
			busy, busyCounting := side(busyPG, busyChannel, busyHandled)
			// Startup reads (the first cycle, the wake sent on connecting)
			// are over once both subscribers have stayed idle a while.
			wakeQuiet(t, quiet, 200*time.Millisecond, true)
			wakeQuiet(t, busyCounting, 200*time.Millisecond, true)
			before := quiet.reads.Load()

			for i := range appends {
				id, _ := wakeAppendOne(t, busy, i)
				require.Equal(t, id, busyHandled.next(t).id, "the busy store's own subscriber is woken")
			}
			if c.oneChannel {
				require.Eventually(t, func() bool { return quiet.reads.Load() > before }, wakeBound, time.Millisecond,
					"one channel: the busy store's NOTIFYs wake the quiet subscriber")
			}
			// A NOTIFY arrives within milliseconds: once the quiet subscriber
			// has made no read for a while, every wake-up has been counted.
			wakeQuiet(t, quiet, 300*time.Millisecond, true)
			woken := quiet.reads.Load() - before
			t.Logf("%s: %d appends to the busy store made the quiet subscriber read its feed %d times", c.name, appends, woken)
			if !c.oneChannel {
				require.Zero(t, woken, "own channels: the busy store's NOTIFYs must not wake the quiet subscriber")
			}
			select {
			case ev := <-quietHandled.ch:
				t.Fatalf("the quiet subscriber handled %s, an event of another schema", ev.id)
			default:
			}
		})
	}
}

// TestGormEventStoreRejectsUnusableChannel: WithNotifyChannel refuses the
// names LISTEN and pg_notify would not treat alike, as the listener does.
func TestGormEventStoreRejectsUnusableChannel(t *testing.T) {
	db := dbtest.NewSQLiteMemory(t)
	for _, channel := range []string{"", strings.Repeat("c", 64), "bad\x00channel"} {
		_, err := infrastructure.NewGormEventStore(db, infrastructure.WithNotifyChannel(channel))
		require.ErrorContains(t, err, "channel name")
		require.ErrorContains(t, err, "WithNotifyChannel")
		_, err = subscriptions.NewPostgresListener(dbtest.DefaultPostgresDSN, subscriptions.WithListenerChannel(channel))
		require.ErrorContains(t, err, "channel name")
	}
	_, err := infrastructure.NewGormEventStore(db, infrastructure.WithNotifyChannel(strings.Repeat("c", 63)))
	require.NoError(t, err)
}
