package subscriptions_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// groupPoll is the tests' group and subscriber poll interval: short, so
// that the tests wait little for a probe or a retry.
const groupPoll = 40 * time.Millisecond

// groupTenant is one tenant of a group test: its feed and, on a database,
// the pool its stores use (nil on memory).
type groupTenant struct {
	feed subscriptions.Feed
	db   *gorm.DB
	pg   *dbtest.Postgres
	file string // SQLite: the database file's DSN
	// read is where the test reads the tenant's tables, through qual:
	// on Postgres a pool of the test's own that keeps its connections
	// (the tenant's keeps none, and would connect per statement), with
	// the tables qualified by the tenant's schema; else the tenant's db.
	read *gorm.DB
}

// qual names the tenant's table for the test's reads (gt.read).
func (gt *groupTenant) qual(table string) string {
	if gt.pg != nil {
		return `"` + gt.pg.Schema + `".` + table
	}
	return table
}

// groupAdmin is a pool on the test server, no schema selected, for the
// tests' reads of many tenants' tables (groupTenant.read).
func groupAdmin(t *testing.T) *gorm.DB {
	t.Helper()
	return dbtest.OpenPostgresDSN(t, dbtest.PostgresDSN())
}

// groupPostgresTenants creates n tenants, each a fresh schema on the test
// server with the GORM stores on a pool of its own that keeps no idle
// connection (see Group: idle tenants then hold none), the projection
// tables given created in it, all of Database "pg".
func groupPostgresTenants(t *testing.T, prefix string, n int, tables ...string) []*groupTenant {
	t.Helper()
	admin := groupAdmin(t)
	pgs := make([]*dbtest.Postgres, n)
	for i := range pgs {
		pgs[i] = dbtest.NewPostgres(t)
	}
	// The migrations are most of the cost: four schemas at a time.
	out := make([]*groupTenant, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for i, pg := range pgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			out[i], errs[i] = newGroupGormTenant(fmt.Sprintf("%s-pg-%d", prefix, i), "pg", pg.DB, tables...)
		}()
	}
	wg.Wait()
	for i, pg := range pgs {
		require.NoError(t, errs[i])
		out[i].pg, out[i].read = pg, admin
		noIdle(t, pg.DB)
	}
	return out
}

// noIdle makes db's pool keep no idle connection (see Group), once the
// migrations ran: they would reconnect per statement.
func noIdle(t *testing.T, db *gorm.DB) {
	t.Helper()
	sqlDB, err := db.DB()
	require.NoError(t, err)
	sqlDB.SetMaxIdleConns(0)
}

// groupSQLiteTenants creates n tenants, each a SQLite file of its own.
func groupSQLiteTenants(t *testing.T, prefix string, n int, tables ...string) []*groupTenant {
	t.Helper()
	out := make([]*groupTenant, n)
	for i := range out {
		file := dbtest.SQLiteFileDSN(fmt.Sprintf("%s/tenant-%d.db", t.TempDir(), i))
		out[i] = groupGormTenant(t, fmt.Sprintf("%s-sqlite-%d", prefix, i), "", dbtest.OpenSQLite(t, file), tables...)
		out[i].file = file
	}
	return out
}

// groupGormTenant is one tenant on db, with the projection tables.
func groupGormTenant(t *testing.T, tenant, database string, db *gorm.DB, tables ...string) *groupTenant {
	t.Helper()
	gt, err := newGroupGormTenant(tenant, database, db, tables...)
	require.NoError(t, err)
	return gt
}

// newGroupGormTenant is groupGormTenant for any goroutine.
func newGroupGormTenant(tenant, database string, db *gorm.DB, tables ...string) (*groupTenant, error) {
	events, err := infrastructure.NewGormEventStore(db)
	if err != nil {
		return nil, err
	}
	cps, err := subscriptions.NewGormCheckpointStore(db)
	if err != nil {
		return nil, err
	}
	lot, err := subscriptions.NewGormParkingLot(db)
	if err != nil {
		return nil, err
	}
	for _, table := range tables {
		// No key: a second delivery of an event would show as a second row.
		if err := db.Exec("CREATE TABLE " + table + " (event_id text NOT NULL, position bigint NOT NULL)").Error; err != nil {
			return nil, err
		}
	}
	return &groupTenant{db: db, read: db, feed: subscriptions.Feed{Tenant: tenant, Database: database, Events: events, Checkpoints: cps, Parking: lot}}, nil
}

// reopen is the tenant as a second process sees it: the same database
// through pools of its own.
func (gt *groupTenant) reopen(t *testing.T) *groupTenant {
	t.Helper()
	switch {
	case gt.pg != nil:
		db := gt.pg.Open(t)
		other := groupGormTenant(t, gt.feed.Tenant, gt.feed.Database, db)
		other.pg, other.read = gt.pg, gt.read
		noIdle(t, db)
		return other
	case gt.file != "":
		return groupGormTenant(t, gt.feed.Tenant, gt.feed.Database, dbtest.OpenSQLite(t, gt.file))
	}
	t.Fatal("a memory tenant cannot be reopened")
	return nil
}

// groupMemoryTenants creates n tenants on memory stores.
func groupMemoryTenants(prefix string, n int) []*groupTenant {
	out := make([]*groupTenant, n)
	for i := range out {
		out[i] = &groupTenant{feed: subscriptions.Feed{
			Tenant:      fmt.Sprintf("%s-mem-%d", prefix, i),
			Events:      infrastructure.NewMemoryStore(),
			Checkpoints: subscriptions.NewMemoryCheckpointStore(),
			Parking:     subscriptions.NewMemoryParkingLot(),
		}}
	}
	return out
}

// groupLedger records the handler calls of a group test by subscriber,
// tenant and event, and checks them against the feeds.
type groupLedger struct {
	mu    sync.Mutex
	calls map[string]int // "name/tenant/eventID" -> calls
	n     int
}

func newGroupLedger() *groupLedger { return &groupLedger{calls: map[string]int{}} }

// handler records each call under name and, on a database tenant, writes
// the event into table through the batch transaction.
func (l *groupLedger) handler(name, table string) subscriptions.Handler {
	return func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		tenant := subscriptions.TenantFromContext(ctx)
		if tenant == "" {
			return errors.New("no tenant in the handler's context")
		}
		if subscriptions.TxFromContext(ctx) != nil {
			if err := project(ctx, table, ev); err != nil {
				return err
			}
		}
		l.mu.Lock()
		l.calls[name+"/"+tenant+"/"+ev.ID]++
		l.n++
		l.mu.Unlock()
		return nil
	}
}

func (l *groupLedger) total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// waitCalls waits until the handlers were called at least n times.
func (l *groupLedger) waitCalls(t *testing.T, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return l.total() >= n }, 60*time.Second, 5*time.Millisecond,
		"the handlers were not called %d times", n)
}

// requireOnce requires every event of every tenant's feed handled once by
// each name: in the projection table, on a database tenant (whose
// committed writes are what counts), and in the handler calls on memory.
func (l *groupLedger) requireOnce(t *testing.T, tenants []*groupTenant, names map[string]string) {
	t.Helper()
	for _, gt := range tenants {
		want := faultFeedIDs(t, gt.feed.Events)
		if gt.read != nil {
			want = nil
			require.NoError(t, gt.read.Raw("SELECT id FROM "+gt.qual("events")+" ORDER BY position").Scan(&want).Error)
		}
		for name, table := range names {
			if gt.db != nil {
				faultRequireExactlyOnce(t, name+"/"+gt.feed.Tenant, projected(t, gt.read, gt.qual(table)), want)
				continue
			}
			l.mu.Lock()
			for _, id := range want {
				require.Equal(t, 1, l.calls[name+"/"+gt.feed.Tenant+"/"+id], "%s/%s: event %s", name, gt.feed.Tenant, id)
			}
			l.mu.Unlock()
		}
	}
}

// runGroup runs g until the test ends (or stop), and requires Run to
// return nil without panicking once cancelled.
type runningGroup struct {
	cancel context.CancelFunc
	done   chan error
}

func runGroup(t *testing.T, g *subscriptions.Group) *runningGroup {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningGroup{cancel: cancel, done: make(chan error, 1)}
	go func() {
		defer func() {
			if v := recover(); v != nil {
				r.done <- fmt.Errorf("Run panicked: %v", v)
			}
		}()
		r.done <- g.Run(ctx)
	}()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels Run and requires it to return nil (once; later calls
// return at once).
func (r *runningGroup) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok {
			close(r.done)
			require.NoError(t, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Group.Run did not return within 30s of its cancellation")
	}
}

// waitGroupCaughtUp waits until every name of every tenant has no lag.
// Each check reads every row's Status (four or five statements a row):
// wait for the handler calls first (groupLedger.waitCalls).
func waitGroupCaughtUp(t *testing.T, g *subscriptions.Group, tenants []*groupTenant) {
	t.Helper()
	ids := make([]string, len(tenants))
	for i, gt := range tenants {
		ids[i] = gt.feed.Tenant
	}
	require.Eventually(t, func() bool {
		rows, err := g.Status(context.Background(), ids...)
		if err != nil {
			return false
		}
		for _, st := range rows {
			if st.Lag != 0 {
				return false
			}
		}
		return len(rows) > 0
	}, 60*time.Second, 100*time.Millisecond, "the group did not catch up")
}

func groupDefs(l *groupLedger, names map[string]string, opts ...subscriptions.SubscriberOption) []subscriptions.GroupSubscriber {
	var defs []subscriptions.GroupSubscriber
	for name, table := range names {
		defs = append(defs, subscriptions.GroupSubscriber{
			Name:    name,
			Handler: l.handler(name, table),
			Options: append([]subscriptions.SubscriberOption{subscriptions.WithPollInterval(groupPoll), subscriptions.WithBatchSize(3)}, opts...),
		})
	}
	return defs
}

// waitCheckpoints waits until every name's checkpoint of every tenant is
// at its feed head, read by the test (one statement per SQLite or memory
// tenant, one per Postgres tenant through the test's own pool).
func waitCheckpoints(t *testing.T, tenants []*groupTenant, names map[string]string) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, gt := range tenants {
			for name := range names {
				var head, cp int64
				if gt.read == nil {
					var err error
					if head, err = gt.feed.Events.HeadPosition(context.Background()); err != nil {
						return false
					}
					if cp, err = gt.feed.Checkpoints.Position(context.Background(), name); err != nil || cp != head {
						return false
					}
					continue
				}
				err := gt.read.Raw("SELECT (SELECT COALESCE(MAX(position), 0) FROM "+gt.qual("events")+"), "+
					"(SELECT COALESCE(MAX(position), 0) FROM "+gt.qual("subscriber_checkpoints")+" WHERE subscriber = ?)", name).Row().Scan(&head, &cp)
				if err != nil || cp != head {
					return false
				}
			}
		}
		return true
	}, 60*time.Second, 20*time.Millisecond, "the group's checkpoints did not reach the feed heads")
}

// TestGroupRunsManyTenantsOnce runs two definitions over 50 Postgres
// schemas, two SQLite files and three memory stores on four workers,
// events appended before and while the group runs: every event of every
// tenant is handled once per definition (the projection tables of the
// database tenants have no key, so a second delivery would show), Status
// has a row per tenant and name, naming the tenant, and the handler's
// context names its tenant.
func TestGroupRunsManyTenantsOnce(t *testing.T) {
	t.Parallel()
	names := map[string]string{"proj-a": "grp_a", "proj-b": "grp_b"}
	tables := []string{"grp_a", "grp_b"}

	pgTenants := groupPostgresTenants(t, "many", 50, tables...)
	tenants := append(slices.Clone(pgTenants), groupSQLiteTenants(t, "many", 2, tables...)...)
	tenants = append(tenants, groupMemoryTenants("many", 3)...)
	notifier := subscriptions.NewInProcessNotifier()
	for _, gt := range tenants {
		gt.feed.Events = subscriptions.NewNotifyingEventStore(gt.feed.Events, notifier.Notify)
		appendN(t, gt.feed.Events, "Before", 0, 2)
	}

	ledger := newGroupLedger()
	g, err := subscriptions.NewGroup(groupDefs(ledger, names), subscriptions.WithGroupWorkers(4),
		subscriptions.WithGroupPollInterval(groupPoll), subscriptions.WithGroupWakeSignal("", notifier.Subscribe()),
		subscriptions.WithGroupLogger(quietLogger()))
	require.NoError(t, err)
	for _, gt := range tenants {
		require.NoError(t, g.Add(gt.feed))
	}
	runGroup(t, g)
	// While it runs: a few events more on every fifth schema and on every
	// other tenant, which only the probe tells the group about.
	events := len(tenants) * 2
	for i, gt := range tenants {
		if gt.pg == nil || i%5 == 0 {
			appendN(t, gt.feed.Events, "During", 2, 2)
			events += 2
		}
	}
	ledger.waitCalls(t, events*len(names))
	waitCheckpoints(t, tenants, names)
	ledger.requireOnce(t, tenants, names)

	sample := []*groupTenant{pgTenants[0], tenants[50], tenants[len(tenants)-1]}
	rows, err := g.Status(context.Background(), sample[0].feed.Tenant, sample[1].feed.Tenant, sample[2].feed.Tenant)
	require.NoError(t, err)
	require.Len(t, rows, len(sample)*len(names))
	for i, st := range rows {
		gt := sample[i/len(names)]
		require.Equal(t, gt.feed.Tenant, st.Tenant)
		head := faultHead(t, gt.feed.Events)
		require.Equal(t, head, st.Position, "%s/%s", st.Tenant, st.Subscriber)
		require.Contains(t, names, st.Subscriber)
	}
}

// groupBackends are the kinds of tenant the behavioural group tests run
// on, one tenant each (prefix names it).
var groupBackends = []struct {
	name string
	new  func(t *testing.T, prefix string) *groupTenant
}{
	{"memory", func(t *testing.T, prefix string) *groupTenant { return groupMemoryTenants(prefix, 1)[0] }},
	{"sqlite", func(t *testing.T, prefix string) *groupTenant { return groupSQLiteTenants(t, prefix, 1, "grp_a")[0] }},
	{"postgres", func(t *testing.T, prefix string) *groupTenant { return groupPostgresTenants(t, prefix, 1, "grp_a")[0] }},
}

// TestGroupAddRemoveWhileRunning adds a tenant to a running group (it is
// handled at once), removes one whose handler is in the middle of a batch
// (Remove returns only once that batch has committed, and nothing of the
// tenant runs after it), and adds it back (it resumes from its
// checkpoint, each event once).
func TestGroupAddRemoveWhileRunning(t *testing.T) {
	t.Parallel()
	for _, b := range groupBackends {
		t.Run(b.name, func(t *testing.T) {
			names := map[string]string{"proj": "grp_a"}
			a, other := b.new(t, "a"), b.new(t, "b")
			entered, release := make(chan struct{}, 1), make(chan struct{})
			ledger := newGroupLedger()
			record := ledger.handler("proj", "grp_a")
			def := subscriptions.GroupSubscriber{Name: "proj", Options: []subscriptions.SubscriberOption{subscriptions.WithPollInterval(groupPoll)},
				Handler: func(ctx context.Context, ev domain.EventEnvelope[any]) error {
					if ev.EventType == "Block" {
						entered <- struct{}{}
						<-release
					}
					return record(ctx, ev)
				}}
			g, err := subscriptions.NewGroup([]subscriptions.GroupSubscriber{def}, subscriptions.WithGroupWorkers(2),
				subscriptions.WithGroupPollInterval(groupPoll), subscriptions.WithGroupLogger(quietLogger()))
			require.NoError(t, err)
			require.NoError(t, g.Add(a.feed))
			running := runGroup(t, g)

			appendN(t, a.feed.Events, "Plain", 0, 2)
			ledger.waitCalls(t, 2)
			require.NoError(t, g.Add(other.feed)) // while running
			require.ErrorIs(t, g.Add(other.feed), subscriptions.ErrTenantExists)
			appendN(t, other.feed.Events, "Plain", 0, 2)
			ledger.waitCalls(t, 4)

			sub, err := g.Subscriber(a.feed.Tenant, "proj")
			require.NoError(t, err)
			require.ErrorIs(t, sub.Run(context.Background()), subscriptions.ErrRunning, "the group runs its subscribers")
			appendN(t, a.feed.Events, "Block", 2, 1)
			<-entered
			removed := make(chan error, 1)
			go func() { removed <- g.Remove(context.Background(), a.feed.Tenant) }()
			require.Never(t, func() bool { return len(removed) > 0 }, 100*time.Millisecond, 5*time.Millisecond,
				"Remove returned while the tenant's handler was still running")
			close(release)
			require.NoError(t, <-removed)
			lag, err := sub.Lag(context.Background())
			require.NoError(t, err)
			require.Zero(t, lag, "the batch in flight drained and committed before Remove returned")
			_, err = g.Subscriber(a.feed.Tenant, "proj")
			require.ErrorIs(t, err, subscriptions.ErrUnknownTenant)
			require.ErrorIs(t, g.Remove(context.Background(), a.feed.Tenant), subscriptions.ErrUnknownTenant)
			require.Equal(t, []string{other.feed.Tenant}, g.Tenants())

			// Nothing of the removed tenant runs: its events wait while the
			// group goes on with the other tenant.
			appendN(t, a.feed.Events, "Plain", 3, 2)
			appendN(t, other.feed.Events, "Plain", 2, 1)
			ledger.waitCalls(t, 6)
			running.stop(t) // the group stops with its tenants' batches drained
			require.Equal(t, 6, ledger.total())
			lag, err = sub.Lag(context.Background())
			require.NoError(t, err)
			require.EqualValues(t, 2, lag)

			// Added back, the tenant resumes from its checkpoint.
			require.NoError(t, g.Add(a.feed))
			runGroup(t, g)
			ledger.waitCalls(t, 8)
			tenants := []*groupTenant{a, other}
			waitCheckpoints(t, tenants, names)
			ledger.requireOnce(t, tenants, names)
		})
	}
}

// TestGroupResetRunsIdleTenant resets the checkpoint of a caught-up
// tenant through its Subscriber: the group, which does not poll idle
// tenants, replays it at once.
func TestGroupResetRunsIdleTenant(t *testing.T) {
	tenant := groupMemoryTenants("reset", 1)[0]
	ledger := newGroupLedger()
	// A poll interval longer than the test: only the reset can wake it.
	g, err := subscriptions.NewGroup(groupDefs(ledger, map[string]string{"proj": ""}),
		subscriptions.WithGroupPollInterval(time.Hour), subscriptions.WithGroupLogger(quietLogger()))
	require.NoError(t, err)
	appendN(t, tenant.feed.Events, "E", 0, 3)
	require.NoError(t, g.Add(tenant.feed))
	runGroup(t, g)
	ledger.waitCalls(t, 3)
	sub, err := g.Subscriber(tenant.feed.Tenant, "proj")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		st, err := sub.Status(context.Background())
		return err == nil && st.State == subscriptions.StateIdle && st.Tenant == tenant.feed.Tenant
	}, 10*time.Second, time.Millisecond)
	require.NoError(t, sub.ResetCheckpoint(context.Background(), 0))
	ledger.waitCalls(t, 6)
}

// TestGroupsShareTenants runs two groups, as two processes would, over
// the same six Postgres schemas and two SQLite files, each through pools
// of its own, while events are appended; one group is stopped in the
// middle of a burst of events, after which none is appended: the other
// takes its tenants over by itself, every event is handled exactly once per tenant (the
// projection tables have no key), and both groups handled some.
func TestGroupsShareTenants(t *testing.T) {
	t.Parallel()
	names := map[string]string{"shared": "grp_a"}
	first := append(groupPostgresTenants(t, "share", 6, "grp_a"), groupSQLiteTenants(t, "share", 2, "grp_a")...)
	second := make([]*groupTenant, len(first))
	for i, gt := range first {
		second[i] = gt.reopen(t)
	}
	newGroup := func(ledger *groupLedger, tenants []*groupTenant) *subscriptions.Group {
		g, err := subscriptions.NewGroup(groupDefs(ledger, names), subscriptions.WithGroupWorkers(2),
			subscriptions.WithGroupPollInterval(groupPoll), subscriptions.WithGroupLogger(quietLogger()))
		require.NoError(t, err)
		for _, gt := range tenants {
			require.NoError(t, g.Add(gt.feed))
		}
		return g
	}
	ledgerA, ledgerB := newGroupLedger(), newGroupLedger()
	groupA := runGroup(t, newGroup(ledgerA, first))
	runGroup(t, newGroup(ledgerB, second))

	appendRound := func(round int) {
		for _, gt := range first {
			appendN(t, gt.feed.Events, "E", round*2, 2)
		}
	}
	for round := range 4 {
		appendRound(round)
	}
	require.Eventually(t, func() bool { return ledgerA.total() > 0 && ledgerB.total() > 0 }, 30*time.Second, time.Millisecond,
		"both groups take a share of the tenants")
	// A burst, and group A stops in the middle of it.
	for _, gt := range first {
		appendN(t, gt.feed.Events, "Burst", 100, 10)
	}
	groupA.stop(t)
	stopped := time.Now()
	// No event comes after: group B finds the rest by itself.
	waitCheckpoints(t, second, names)
	t.Logf("group B caught up %v after group A stopped; handler calls: A %d, B %d", time.Since(stopped), ledgerA.total(), ledgerB.total())
	newGroupLedger().requireOnce(t, first, names) // the projections, the committed writes
}

// TestGroupTelemetryCarriesTenant runs one definition over two memory
// tenants with an SDK: the events counter, the lag gauge and the batch
// and handler spans have a series (or an attribute) per tenant.
func TestGroupTelemetryCarriesTenant(t *testing.T) {
	k := newTelemetryKit(t)
	tenants := groupMemoryTenants("tel", 2)
	ledger := newGroupLedger()
	g, err := subscriptions.NewGroup(groupDefs(ledger, map[string]string{"proj": ""}, k.options()...),
		subscriptions.WithGroupPollInterval(groupPoll), subscriptions.WithGroupLogger(quietLogger()))
	require.NoError(t, err)
	for i, gt := range tenants {
		appendN(t, gt.feed.Events, "E", 0, i+1)
		require.NoError(t, g.Add(gt.feed))
	}
	runGroup(t, g)
	ledger.waitCalls(t, 3)
	waitCheckpoints(t, tenants, map[string]string{"proj": ""})

	tenantOf := func(attrs attribute.Set) string {
		v, _ := attrs.Value(subscriptions.AttrTenant)
		return v.AsString()
	}
	ms := k.collect(t)
	handled := map[string]int64{}
	for _, dp := range ms[subscriptions.MetricEvents].(metricdata.Sum[int64]).DataPoints {
		if o, _ := dp.Attributes.Value(subscriptions.AttrOutcome); o.AsString() == subscriptions.OutcomeHandled {
			handled[tenantOf(dp.Attributes)] += dp.Value
		}
	}
	require.Equal(t, map[string]int64{tenants[0].feed.Tenant: 1, tenants[1].feed.Tenant: 2}, handled)
	lags := map[string]int64{}
	for _, dp := range ms[subscriptions.MetricLagEvents].(metricdata.Gauge[int64]).DataPoints {
		lags[tenantOf(dp.Attributes)] = dp.Value
	}
	require.Equal(t, map[string]int64{tenants[0].feed.Tenant: 0, tenants[1].feed.Tenant: 0}, lags)

	endedSpans := func() map[string]map[string]bool {
		spans := map[string]map[string]bool{}
		for _, span := range k.spans.Ended() {
			for _, kv := range span.Attributes() {
				if kv.Key == subscriptions.AttrTenant {
					if spans[span.Name()] == nil {
						spans[span.Name()] = map[string]bool{}
					}
					spans[span.Name()][kv.Value.AsString()] = true
				}
			}
		}
		return spans
	}
	want := map[string]bool{tenants[0].feed.Tenant: true, tenants[1].feed.Tenant: true}
	// A batch span ends just after its commit, which the checkpoints
	// above may show first: wait for both tenants' spans to end.
	require.Eventually(t, func() bool { return len(endedSpans()[subscriptions.SpanBatch]) == len(want) }, 30*time.Second, time.Millisecond)
	spans := endedSpans()
	require.Equal(t, want, spans[subscriptions.SpanBatch])
	require.Equal(t, want, spans[subscriptions.SpanHandle])
}

// TestNewGroupRefuses checks NewGroup's and Add's refusals.
func TestNewGroupRefuses(t *testing.T) {
	noop := func(context.Context, domain.EventEnvelope[any]) error { return nil }
	def := func(opts ...subscriptions.SubscriberOption) []subscriptions.GroupSubscriber {
		return []subscriptions.GroupSubscriber{{Name: "proj", Handler: noop, Options: opts}}
	}
	for name, tc := range map[string]struct {
		defs []subscriptions.GroupSubscriber
		opts []subscriptions.GroupOption
		want string
	}{
		"no definition": {nil, nil, "no subscriber definition"},
		"twice":         {append(def(), def()...), nil, "defined twice"},
		"wake signal":   {def(subscriptions.WithWakeSignal(make(chan struct{}))), nil, "WithWakeSignal"},
		"parking lot":   {def(subscriptions.WithParkingLot(subscriptions.NewMemoryParkingLot())), nil, "Feed.Parking"},
		"concurrency":   {def(subscriptions.WithPartitions(4), subscriptions.WithConcurrency(5)), nil, "exceeds the 4 partitions"},
		"batch size":    {def(subscriptions.WithBatchSize(0)), nil, "WithBatchSize"},
		"nil handler":   {[]subscriptions.GroupSubscriber{{Name: "proj"}}, nil, "nil handler"},
		"workers":       {def(), []subscriptions.GroupOption{subscriptions.WithGroupWorkers(0)}, "WithGroupWorkers"},
		"poll interval": {def(), []subscriptions.GroupOption{subscriptions.WithGroupPollInterval(0)}, "WithGroupPollInterval"},
		"nil wake":      {def(), []subscriptions.GroupOption{subscriptions.WithGroupWakeSignal("db", nil)}, "nil channel"},
		"reserved name": {[]subscriptions.GroupSubscriber{{Name: "", Handler: noop}}, nil, "name"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := subscriptions.NewGroup(tc.defs, tc.opts...)
			require.ErrorContains(t, err, tc.want)
		})
	}
	g, err := subscriptions.NewGroup(def())
	require.NoError(t, err)
	require.ErrorContains(t, g.Add(subscriptions.Feed{}), "empty tenant")
	tenant := groupMemoryTenants("refuse", 1)[0].feed
	tenant.Checkpoints = nil
	require.ErrorContains(t, g.Add(tenant), `"refuse-mem-0"`)
	require.ErrorContains(t, g.Add(tenant), "nil checkpoint store")
	require.Empty(t, g.Tenants())
}

// TestGroupHandlerPanic makes a handler panic: its batch rolls back, the
// group stops, and Run panics with the handler's value.
func TestGroupHandlerPanic(t *testing.T) {
	tenant := groupMemoryTenants("panic", 1)[0]
	g, err := subscriptions.NewGroup([]subscriptions.GroupSubscriber{{Name: "proj", Handler: func(context.Context, domain.EventEnvelope[any]) error {
		panic("handler bug")
	}}}, subscriptions.WithGroupLogger(quietLogger()))
	require.NoError(t, err)
	require.NoError(t, g.Add(tenant.feed))
	appendN(t, tenant.feed.Events, "E", 0, 1)
	require.PanicsWithValue(t, "handler bug", func() { _ = g.Run(context.Background()) })
	pos, err := tenant.feed.Checkpoints.Position(context.Background(), "proj")
	require.NoError(t, err)
	require.Zero(t, pos)
}

// TestGroupProbeFallsBack puts tenants whose stores cannot be probed
// together under one Database: a Postgres schema with a memory store (the
// prober refuses the memory store) and two memory stores (no prober). The
// group reads each idle tenant's head instead, logs that once, and every
// event appended while the tenants idle is handled.
func TestGroupProbeFallsBack(t *testing.T) {
	t.Parallel()
	mixed := append(groupPostgresTenants(t, "fallback", 1, "grp_a"), groupMemoryTenants("fallback", 3)...)
	mixed[1].feed.Database = "pg"
	mixed[2].feed.Database, mixed[3].feed.Database = "mem", "mem"
	logger, logs := newLogger()
	ledger := newGroupLedger()
	g, err := subscriptions.NewGroup(groupDefs(ledger, map[string]string{"proj": "grp_a"}),
		subscriptions.WithGroupPollInterval(groupPoll), subscriptions.WithGroupLogger(logger))
	require.NoError(t, err)
	for _, gt := range mixed {
		require.NoError(t, g.Add(gt.feed))
	}
	runGroup(t, g)
	require.Eventually(t, func() bool {
		rows, err := g.Status(context.Background())
		if err != nil || len(rows) != len(mixed) {
			return false
		}
		for _, st := range rows {
			if st.State != subscriptions.StateIdle {
				return false
			}
		}
		return true
	}, 10*time.Second, 5*time.Millisecond)
	for _, gt := range mixed {
		appendN(t, gt.feed.Events, "E", 0, 2)
	}
	ledger.waitCalls(t, 2*len(mixed))
	waitCheckpoints(t, mixed, map[string]string{"proj": "grp_a"})
	ledger.requireOnce(t, mixed, map[string]string{"proj": "grp_a"})
	require.Equal(t, 1, strings.Count(logs.String(), "cannot be probed in one statement"), logs.String())
}
