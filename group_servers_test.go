package subscriptions_test

// Tenants spread over several Postgres servers (issue 29): the test
// server and private clusters of the test's own (dbtest.NewCluster), one
// of them behind a PgBouncer. A server that goes down stalls only its
// tenants, which resume on their own once it is back; the connections a
// group holds on each server stay within its budget throughout.

import (
	"context"
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

// serversTable is the servers tests' projection table: no key, so that a
// second delivery shows as a second row, and seq, from a sequence, records
// the order the rows were written in (per-aggregate order). The crash
// child writes its four columns into it (internal/cmd/crashchild).
const serversTable = "srv_proj"

// serversPartsTable is the projection of the partitioned definition of
// TestGroupServersSurviveSIGKILL's children.
const serversPartsTable = serversTable + "_parts"

// serverTenant is one tenant of the servers tests: a schema on one of the
// servers, which the test appends to and reads through a pool of its own
// (pg.DB, straight to the server), while the group reaches it through
// groupDSN (with the group's application_name, and through a PgBouncer
// for one cluster).
type serverTenant struct {
	name, database string
	pg             *dbtest.Postgres
	groupDSN       string
	events         domain.EventStore // the test's appends, on pg.DB
	// feed is the group's stores, on a pool on groupDSN (serversFeed).
	feed subscriptions.Feed
}

// server is one Postgres server of the test and the tenants on it.
type server struct {
	database string
	cluster  *dbtest.Cluster // nil: the test server
	bouncer  bool            // the group reaches its tenants through a PgBouncer
	// admin is a pool on the server, no schema selected: the session
	// counts.
	admin   *gorm.DB
	tenants []*serverTenant
}

// newServer opens the admin pool of a server: the test server when
// cluster is nil.
func newServer(t *testing.T, database string, cluster *dbtest.Cluster, bouncer bool) *server {
	t.Helper()
	dsn := dbtest.PostgresDSN()
	if cluster != nil {
		dsn = cluster.DSN()
	}
	admin := dbtest.OpenPostgresDSN(t, dsn)
	sqlDB, err := admin.DB()
	require.NoError(t, err)
	sqlDB.SetMaxOpenConns(2)
	return &server{database: database, cluster: cluster, bouncer: bouncer, admin: admin}
}

// addTenants creates n tenants on the server, each a schema with the
// module's tables and serversTable, whose group DSN carries app.
func (s *server) addTenants(t *testing.T, prefix, app string, n int) []*serverTenant {
	t.Helper()
	out := make([]*serverTenant, n)
	for i := range out {
		var pg *dbtest.Postgres
		if s.cluster != nil {
			pg = s.cluster.NewPostgres(t)
		} else {
			pg = dbtest.NewPostgres(t)
		}
		out[i] = &serverTenant{name: fmt.Sprintf("%s-%s-%d", prefix, s.database, i), database: s.database, pg: pg}
	}
	// The migrations are most of the cost: all at once.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, st := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			events, err := infrastructure.NewGormEventStore(st.pg.DB)
			for _, table := range []string{serversTable, serversPartsTable} {
				if err == nil {
					err = st.pg.DB.Exec("CREATE TABLE " + table + " (event_id text NOT NULL, position bigint NOT NULL," +
						" pid bigint, handled_at bigint, seq bigserial)").Error
				}
			}
			st.events, errs[i] = events, err
		}()
	}
	wg.Wait()
	for i, st := range out {
		require.NoError(t, errs[i], st.name)
		dsn := st.pg.DSN
		if s.bouncer {
			dsn = st.pg.BouncerDSN(t, 2)
		}
		st.groupDSN = dsn
		if app != "" {
			st.groupDSN = faultDSN(t, dsn, "application_name", app)
		}
	}
	s.tenants = append(s.tenants, out...)
	return out
}

// serversFeed opens the group's stores of st: GORM on a pool of its own
// on the group DSN, keeping no idle connection (see Group), so that what
// the server counts is what the group uses.
func serversFeed(t *testing.T, st *serverTenant) subscriptions.Feed {
	t.Helper()
	db := dbtest.OpenPostgresDSN(t, st.groupDSN)
	gt := groupGormTenant(t, st.name, st.database, db)
	noIdle(t, db)
	return gt.feed
}

// session is one server session of the group's, as pg_stat_activity
// shows it.
type session struct {
	State, Line string
}

// busy reports whether the session is in use: running a statement or in
// a transaction. A session whose client has closed it lingers idle until
// its backend gets the CPU to exit, which on a loaded machine overlaps
// the connection the group opens next: only busy sessions are held.
func (s session) busy() bool { return s.State != "idle" }

// sessions lists the server's sessions of application_name app.
func (s *server) sessions(app string) ([]session, error) {
	var rows []session
	err := s.admin.Raw("SELECT state, concat_ws(' ', pid, state, backend_start::time, query_start::time, left(query, 60)) AS line "+
		"FROM pg_stat_activity WHERE application_name = ?", app).Scan(&rows).Error
	return rows, err
}

// progress reads the tenant's feed head and the checkpoint of name (0 if
// none yet), through the test's own pool; an error while its server is
// down. For a partitioned name (ending in -parts), whose partitions have
// checkpoints of their own, the checkpoint is the position before the
// first event not in its projection (serversPartsTable): every event up
// to it is handled, as a checkpoint says.
func (st *serverTenant) progress(name string) (head, checkpoint int64, err error) {
	if strings.HasSuffix(name, "-parts") {
		err = st.pg.DB.Raw("SELECT (SELECT COALESCE(MAX(position), 0) FROM events), "+
			"(SELECT COALESCE(MIN(e.position) - 1, (SELECT COALESCE(MAX(position), 0) FROM events)) FROM events e "+
			"WHERE NOT EXISTS (SELECT 1 FROM "+serversPartsTable+" p WHERE p.event_id = e.id))").Row().Scan(&head, &checkpoint)
		return head, checkpoint, err
	}
	err = st.pg.DB.Raw("SELECT (SELECT COALESCE(MAX(position), 0) FROM events), "+
		"(SELECT COALESCE(MAX(position), 0) FROM subscriber_checkpoints WHERE subscriber = ?)", name).Row().Scan(&head, &checkpoint)
	return head, checkpoint, err
}

// sessionGauge samples the group's sessions on every server, by
// application_name, until stopped, and keeps the most busy ones (and the
// most in all) seen at once on each. A server that is down is skipped.
type sessionGauge struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	busy map[string]int // "database/app" -> most busy sessions at once
	all  map[string]int // "database/app" -> most sessions at once, idle ones included
	// at is the sessions of the sample that saw the most busy, by key.
	at map[string]string
	n  int // samples taken
}

func startSessionGauge(t *testing.T, servers []*server, apps ...string) *sessionGauge {
	t.Helper()
	g := &sessionGauge{stop: make(chan struct{}), done: make(chan struct{}), busy: map[string]int{}, all: map[string]int{}, at: map[string]string{}}
	go func() {
		defer close(g.done)
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for {
			for _, s := range servers {
				for _, app := range apps {
					rows, err := s.sessions(app)
					if err != nil {
						continue // down
					}
					busy := 0
					lines := make([]string, len(rows))
					for i, r := range rows {
						if r.busy() {
							busy++
						}
						lines[i] = r.Line
					}
					g.mu.Lock()
					key := s.database + "/" + app
					if busy > g.busy[key] {
						g.busy[key] = busy
						g.at[key] = time.Now().Format("15:04:05.000") + ":\n\t" + strings.Join(lines, "\n\t")
					}
					g.all[key] = max(g.all[key], len(rows))
					g.n++
					g.mu.Unlock()
				}
			}
			select {
			case <-g.stop:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(g.halt)
	return g
}

func (g *sessionGauge) halt() {
	select {
	case <-g.stop:
	default:
		close(g.stop)
	}
	<-g.done
}

// requireWithin stops sampling and requires at most budget busy sessions
// of app at once on every server.
func (g *sessionGauge) requireWithin(t *testing.T, servers []*server, app string, budget int) {
	t.Helper()
	g.halt()
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, s := range servers {
		key := s.database + "/" + app
		t.Logf("server %s: at most %d busy sessions of %s at once, %d counting those closing (%d samples in all)", s.database, g.busy[key], app, g.all[key], g.n)
		require.LessOrEqual(t, g.busy[key], budget, "server %s: the group held more sessions than workers + the probe, at %s", s.database, g.at[key])
	}
}

// serversRequireOnceInOrder requires the tenant's projection to hold
// every event of its feed exactly once, and each aggregate's events in
// their order.
func serversRequireOnceInOrder(t *testing.T, st *serverTenant, table string) {
	t.Helper()
	var feed, got []string
	require.NoError(t, st.pg.DB.Raw("SELECT id FROM events ORDER BY position").Scan(&feed).Error)
	require.NoError(t, st.pg.DB.Raw("SELECT event_id FROM "+table+" ORDER BY seq").Scan(&got).Error)
	faultRequireExactlyOnce(t, st.name+"/"+table, got, feed)
	var rows []struct {
		AggregateID string
		SequenceNo  int64
	}
	require.NoError(t, st.pg.DB.Raw("SELECT e.aggregate_id, e.sequence_no FROM "+table+" p JOIN events e ON e.id = p.event_id ORDER BY p.seq").
		Scan(&rows).Error)
	last := map[string]int64{}
	for _, r := range rows {
		require.Greater(t, r.SequenceNo, last[r.AggregateID], "%s/%s: aggregate %s handled out of order", st.name, table, r.AggregateID)
		last[r.AggregateID] = r.SequenceNo
	}
}

// serversProject writes ev into table through the batch transaction.
func serversProject(table string) subscriptions.Handler {
	return func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		tx := subscriptions.TxFromContext(ctx)
		if tx == nil {
			return fmt.Errorf("no batch transaction in the handler's context")
		}
		return tx.Exec("INSERT INTO "+table+" (event_id, position) VALUES (?, ?)", ev.ID, ev.Position).Error
	}
}

// waitAdvanced waits until every tenant's checkpoint of every name has
// reached the head the tenant had when called plus more: it proves that
// tenants go on being processed. The heads are read first, after waiting
// for grow more events to be appended to each.
func waitAdvanced(t *testing.T, what string, tenants []*serverTenant, names []string, grow int64) {
	t.Helper()
	heads := make([]int64, len(tenants))
	for i, st := range tenants {
		h0, _, err := st.progress(names[0])
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			h, _, err := st.progress(names[0])
			heads[i] = h
			return err == nil && h >= h0+grow
		}, 30*time.Second, 5*time.Millisecond, "%s: nothing appended to %s", what, st.name)
	}
	for i, st := range tenants {
		for _, name := range names {
			require.Eventually(t, func() bool {
				_, cp, err := st.progress(name)
				return err == nil && cp >= heads[i]
			}, 30*time.Second, 5*time.Millisecond, "%s: %s/%s was not processed past %d", what, st.name, name, heads[i])
		}
	}
}

// waitAllAtHead waits until every tenant's checkpoint of every name is at
// its feed head.
func waitAllAtHead(t *testing.T, tenants []*serverTenant, names []string) {
	t.Helper()
	for _, st := range tenants {
		for _, name := range names {
			var head, cp int64
			require.Eventually(t, func() bool {
				var err error
				head, cp, err = st.progress(name)
				return err == nil && head == cp
			}, 60*time.Second, 10*time.Millisecond, "%s/%s did not reach its head", st.name, name)
		}
	}
}

// TestGroupTenantsOnSeveralServers runs a Group of two definitions (one
// partitioned: 4 partitions, 2 at once) over
// tenants on three servers: two schemas on the test server, two on a
// private cluster reached directly, two on another reached through a
// PgBouncer, while every tenant is appended to. Both clusters are stopped
// in the middle (one refuses connections, the PgBouncer in front of the
// other holds its clients' statements): the test server's tenants go on
// being processed while they are down; a tenant of a stopped server is
// removed (Remove returns at once) and a new tenant is added. Once the
// clusters are started again their tenants resume on their own, without a
// restart of the group, and the removed one, added back, resumes too. At the end every event of every tenant is
// handled exactly once per definition, each aggregate's in order, and the
// group never held more than workers + 1 (the probe) sessions on a
// server, counted by the server.
func TestGroupTenantsOnSeveralServers(t *testing.T) {
	t.Parallel()
	began := time.Now()
	const workers = 3
	names := []string{"srv-a", "srv-parts"} // srv-parts is partitioned
	tables := map[string]string{"srv-a": serversTable, "srv-parts": serversPartsTable}
	app := faultAppName()

	home := newServer(t, "home", nil, false)
	direct := newServer(t, "direct", dbtest.NewCluster(t), false)
	bounced := newServer(t, "bounced", dbtest.NewCluster(t), true)
	servers := []*server{home, direct, bounced}
	var all []*serverTenant
	for _, s := range servers {
		n := 2
		if s == home {
			n = 3 // the third is added while the group runs
		}
		all = append(all, s.addTenants(t, "srv", app, n)...)
	}
	for _, st := range all {
		st.feed = serversFeed(t, st)
	}
	late := home.tenants[2]

	var defs []subscriptions.GroupSubscriber
	for _, name := range names {
		opts := []subscriptions.SubscriberOption{subscriptions.WithPollInterval(groupPoll), subscriptions.WithBatchSize(10)}
		if name == "srv-parts" {
			opts = append(opts, subscriptions.WithPartitions(4), subscriptions.WithConcurrency(2))
		}
		defs = append(defs, subscriptions.GroupSubscriber{Name: name, Handler: serversProject(tables[name]), Options: opts})
	}
	logger, logs := newLogger()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("GROUP LOG:\n%s", logs.String())
		}
	})
	g, err := subscriptions.NewGroup(defs, subscriptions.WithGroupWorkers(workers),
		subscriptions.WithGroupPollInterval(groupPoll), subscriptions.WithGroupLogger(logger))
	require.NoError(t, err)
	for _, st := range all {
		if st != late {
			require.NoError(t, g.Add(st.feed))
		}
	}
	gauge := startSessionGauge(t, servers, app)
	var writers []*faultWriter
	for _, st := range all {
		writers = append(writers, faultStartWriter(t, st.events, "srv.e", 150*time.Millisecond, 2, 1_000_000))
	}
	runGroup(t, g)
	t.Logf("three servers, %d tenants set up in %v", len(all), time.Since(began).Round(time.Millisecond))
	var early []*serverTenant
	for _, st := range all {
		if st != late {
			early = append(early, st)
		}
	}
	waitAdvanced(t, "before the outage", early, names, 3)

	// Both clusters go down: the one reached directly refuses
	// connections, the PgBouncer in front of the other queues its
	// clients' statements (up to its query_wait_timeout, two minutes).
	var up []*serverTenant
	for _, st := range early {
		if st.database == home.database {
			up = append(up, st)
		}
	}
	direct.cluster.Stop(t)
	bounced.cluster.Stop(t)
	stopped := time.Now()
	removed := direct.tenants[1]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	require.NoError(t, g.Remove(ctx, removed.name), "removing a tenant of a server that is down")
	cancel()
	require.NoError(t, g.Add(late.feed))
	// Once the group found the direct cluster down, its tenant's units
	// are held, not retried every poll interval: at most the cycle each
	// had in flight fails after that.
	retries := func() int {
		return strings.Count(logs.String(), "tenant="+direct.tenants[0].name+" subscriber=")
	}
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), `database does not answer; its tenants wait until a probe reaches it" database=direct`)
	},
		30*time.Second, 5*time.Millisecond, "the group did not find the direct cluster down")
	failedBefore := retries()
	waitAdvanced(t, "while two servers are down", append(up, late), names, 5)
	t.Logf("the test server's tenants went on %v after the others stopped", time.Since(stopped).Round(time.Millisecond))
	require.LessOrEqual(t, retries(), failedBefore+len(names), "the units of a database that is down went on failing")
	t.Logf("%s: %d failures logged before the group found its server down, %d after", direct.tenants[0].name, failedBefore, retries()-failedBefore)

	direct.cluster.Start(t)
	bounced.cluster.Start(t)
	restarted := time.Now()
	require.NoError(t, g.Add(removed.feed))
	waitAdvanced(t, "after the servers came back", append(direct.tenants, bounced.tenants...), names, 3)
	t.Logf("the restarted servers' tenants resumed %v after they started", time.Since(restarted).Round(time.Millisecond))

	for _, w := range writers {
		w.stop()
	}
	waitAllAtHead(t, all, names)
	gauge.requireWithin(t, servers, app, workers+1)
	for _, st := range all {
		for _, name := range names {
			serversRequireOnceInOrder(t, st, tables[name])
		}
	}
	require.NotContains(t, logs.String(), "cannot run for this tenant")
}

// TestGroupServersSurviveSIGKILL runs the group in child processes
// (internal/cmd/crashchild -tenant), two at a time over the same tenants:
// two schemas on the test server and two on a private cluster, appended
// to all along. The cluster is stopped, and one child is SIGKILLed while
// it is down; the cluster is started again, a new child takes the killed
// one's place, and the other is SIGKILLed in turn. Each child runs a plain
// and a partitioned definition (4 partitions, 2 at once). The children never
// held more than workers + 1 sessions on a server each, counted by the
// server, and once the last one has caught up every event of every tenant
// was handled exactly once, each aggregate's in order.
func TestGroupServersSurviveSIGKILL(t *testing.T) {
	t.Parallel()
	const workers, name = 2, "srv-kill"
	names := []string{name, name + "-parts"} // the child's plain and partitioned definitions
	bin := faultBuildChild(t)
	home := newServer(t, "home", nil, false)
	cluster := newServer(t, "cluster", dbtest.NewCluster(t), false)
	servers := []*server{home, cluster}
	var tenants []*serverTenant
	for _, s := range servers {
		tenants = append(tenants, s.addTenants(t, "kill", "", 2)...)
	}
	var writers []*faultWriter
	for _, st := range tenants {
		writers = append(writers, faultStartWriter(t, st.events, "srv.e", 150*time.Millisecond, 2, 1_000_000))
	}
	apps := []string{faultAppName(), faultAppName(), faultAppName()} // a child each
	gauge := startSessionGauge(t, servers, apps...)
	started := 0
	start := func() *faultChild {
		app := apps[started]
		started++
		args := []string{"-name", name, "-workers", fmt.Sprint(workers), "-batch", "10", "-poll", groupPoll.String(), "-table", serversTable,
			"-partitions", "4", "-concurrency", "2"}
		for _, st := range tenants {
			args = append(args, "-tenant", st.name+"|"+st.database+"|"+faultDSN(t, st.groupDSN, "application_name", app))
		}
		c := faultStartChild(t, bin, args...)
		c.waitReady(t)
		return c
	}
	first, second := start(), start()
	// Both take a share of the tenants before anything goes wrong.
	handledBy := func(pid int) bool {
		for _, st := range tenants {
			var n int64
			if st.pg.DB.Raw("SELECT count(*) FROM "+serversTable+" WHERE pid = ?", pid).Scan(&n).Error == nil && n > 0 {
				return true
			}
		}
		return false
	}
	require.Eventually(t, func() bool { return handledBy(first.pid) && handledBy(second.pid) }, 30*time.Second, 10*time.Millisecond,
		"both children commit batches")

	cluster.cluster.Stop(t)
	waitAdvanced(t, "while the cluster is down", home.tenants, names, 3)
	first.kill(t)
	waitAdvanced(t, "after a child was killed", home.tenants, names, 3)
	cluster.cluster.Start(t)
	third := start()
	waitAdvanced(t, "after the cluster came back", tenants, names, 3)
	second.kill(t)
	waitAdvanced(t, "after the second kill", tenants, names, 3)

	for _, w := range writers {
		w.stop()
	}
	waitAllAtHead(t, tenants, names)
	third.term(t)
	faultRequireCleanOutput(t, first.out.String(), second.out.String(), third.out.String())
	for _, app := range apps {
		gauge.requireWithin(t, servers, app, workers+1)
	}
	for _, st := range tenants {
		serversRequireOnceInOrder(t, st, serversTable)
		serversRequireOnceInOrder(t, st, serversPartsTable)
	}
}
