package subscriptions_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/migrations/schema"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// socketGauge counts the connections to the server that pools opened
// through it (groupCountedDB), as they are dialled and closed: open now,
// the most open at once, and the dials of each pool.
type socketGauge struct {
	open, max atomic.Int64
}

func (g *socketGauge) opened() {
	n := g.open.Add(1)
	for {
		m := g.max.Load()
		if n <= m || g.max.CompareAndSwap(m, n) {
			return
		}
	}
}

// countedSocket is a connection that tells its gauge when it closes.
type countedSocket struct {
	net.Conn
	gauge *socketGauge
	once  sync.Once
}

func (c *countedSocket) Close() error {
	c.once.Do(func() { c.gauge.open.Add(-1) })
	return c.Conn.Close()
}

// groupCountedDB opens a GORM pool on dsn, on pgx's own driver (so that
// the stores take their pgx paths), whose connections are counted by
// gauge at the socket and whose dials are counted in dials.
func groupCountedDB(t *testing.T, dsn string, gauge *socketGauge, dials *atomic.Int64) *gorm.DB {
	t.Helper()
	config, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	var dialer net.Dialer
	config.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		dials.Add(1)
		gauge.opened()

		return &countedSocket{Conn: conn, gauge: gauge}, nil
	}
	sqlDB := stdlib.OpenDB(*config)
	t.Cleanup(func() { _ = sqlDB.Close() })
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	return db
}

// TestGroupConnectionBudget runs one definition over 8 Postgres schemas,
// each tenant on a pool of its own that keeps no idle connection (see
// Group), on two workers, woken by one PostgresListener for the database.
// While the backlog drains, the tenants' pools never have more than the
// budget open at once, workers + 1 (the probe), whatever the number of
// tenants, counted at the sockets. Once caught up, the idle tenants issue
// no statement at all: with no idle connection kept, every statement
// dials, and no pool dials but the first tenant's, which the probe uses,
// while the probe runs several times. An append then still reaches an
// idle tenant through the listener.
func TestGroupConnectionBudget(t *testing.T) {
	t.Parallel()
	const tenantsN, workers, backlog = 8, 2, 8
	admin := groupAdmin(t)
	names := map[string]string{"budget": "grp_a"}
	var gauge socketGauge
	dials := make([]atomic.Int64, tenantsN)
	var tenants []*groupTenant
	for i := range tenantsN {
		pg := dbtest.NewPostgres(t)
		db := groupCountedDB(t, pg.DSN, &gauge, &dials[i])
		gt := groupGormTenant(t, "budget-"+string(rune('a'+i)), "pg", db, "grp_a")
		gt.pg, gt.read = pg, admin
		noIdle(t, db)
		tenants = append(tenants, gt)
		appendN(t, gt.feed.Events, "Backlog", 0, backlog)
	}
	listener, err := subscriptions.NewPostgresListener(tenants[0].pg.DSN, subscriptions.WithListenerLogger(quietLogger()))
	require.NoError(t, err)
	lctx, stopListener := context.WithCancel(context.Background())
	listened := make(chan error, 1)
	go func() { listened <- listener.Run(lctx) }()
	t.Cleanup(func() { stopListener(); require.NoError(t, <-listened) })

	ledger := newGroupLedger()
	g, err := subscriptions.NewGroup(groupDefs(ledger, names), subscriptions.WithGroupWorkers(workers),
		subscriptions.WithGroupPollInterval(groupPoll), subscriptions.WithGroupWakeSignal("pg", listener.Subscribe()),
		subscriptions.WithGroupLogger(quietLogger()))
	require.NoError(t, err)
	for _, gt := range tenants {
		require.NoError(t, g.Add(gt.feed))
	}
	require.Zero(t, gauge.open.Load(), "the tenants' pools keep no connection before the group runs")
	gauge.max.Store(0)
	runGroup(t, g)
	ledger.waitCalls(t, tenantsN*backlog)
	waitCheckpoints(t, tenants, names)
	t.Logf("%d tenants, %d workers: at most %d connections open at once in the tenants' pools", tenantsN, workers, gauge.max.Load())
	require.LessOrEqual(t, gauge.max.Load(), int64(workers+1), "the tenants' pools had more open than workers + the probe")
	newGroupLedger().requireOnce(t, tenants, names)

	// Idle: only the probe, on the first tenant's pool, dials.
	before := make([]int64, tenantsN)
	for i := range dials {
		before[i] = dials[i].Load()
	}
	require.Eventually(t, func() bool { return dials[0].Load() >= before[0]+5 }, 30*time.Second, 5*time.Millisecond,
		"the probe did not run five times")
	for i := 1; i < tenantsN; i++ {
		require.Equal(t, before[i], dials[i].Load(), "idle tenant %s issued a statement", tenants[i].feed.Tenant)
	}

	appendN(t, tenants[tenantsN-1].feed.Events, "Late", backlog, 1)
	ledger.waitCalls(t, tenantsN*backlog+1)
}

// TestProbeHeads reads the heads of three schemas' event stores in one
// statement, through the GORM and the pgx stores, and checks what each
// refuses (errors.ErrUnsupported, on which a Group reads each head).
func TestProbeHeads(t *testing.T) {
	t.Parallel()
	var gormStores, pgxStores []domain.EventStore
	var want []int64
	for i := range 3 {
		pg := dbtest.NewPostgres(t)
		gs, err := infrastructure.NewGormEventStore(pg.DB)
		require.NoError(t, err)
		ps, err := pgxstore.NewEventStore(context.Background(), pg.OpenPgx(t))
		require.NoError(t, err)
		appendN(t, gs, "E", 0, 2*i)
		gormStores, pgxStores, want = append(gormStores, gs), append(pgxStores, ps), append(want, int64(2*i))
	}
	ctx := context.Background()
	for name, stores := range map[string][]domain.EventStore{"gorm": gormStores, "pgx": pgxStores} {
		prober := stores[1].(subscriptions.HeadProber)
		heads, err := prober.ProbeHeads(ctx, stores)
		require.NoError(t, err, name)
		require.Equal(t, want, heads, name)
		_, err = prober.ProbeHeads(ctx, []domain.EventStore{gormStores[0], pgxStores[0]})
		require.ErrorIs(t, err, errors.ErrUnsupported, name)
	}
	sqlite, err := infrastructure.NewGormEventStore(dbtest.NewSQLiteFile(t))
	require.NoError(t, err)
	_, err = sqlite.ProbeHeads(ctx, []domain.EventStore{sqlite})
	require.ErrorIs(t, err, errors.ErrUnsupported)
}

// TestGroupTenantsShareOnePool runs two definitions, one of them
// partitioned (4 partitions, 2 at once), over 8 tenant
// schemas whose stores all name their schema (WithSchema: GORM's, in this
// package and in infrastructure, and pgxstore's) on one pool, counted at
// the sockets, whose search_path names a schema with no table, on two
// workers woken by one PostgresListener. Each handler writes into its own
// tenant's table, qualified by TenantFromContext, through the batch
// transaction. While the backlog drains the shared pool never has more
// than workers + 1 (the probe) open at once; every tenant's events are
// projected exactly once, into its own tables only; and once caught up
// an append to one tenant reaches it through the listener.
func TestGroupTenantsShareOnePool(t *testing.T) {
	t.Parallel()
	t.Run("gorm", func(t *testing.T) {
		t.Parallel()
		pg := dbtest.NewPostgres(t)
		var gauge socketGauge
		var dials atomic.Int64
		db := groupCountedDB(t, pg.DSN, &gauge, &dials)
		runSharedPoolGroup(t, pg, &gauge, func(s, channel string) subscriptions.Feed {
			events, err := infrastructure.NewGormEventStore(db, infrastructure.WithSchema(s), infrastructure.WithNotifyChannel(channel))
			require.NoError(t, err)
			cps, err := subscriptions.NewGormCheckpointStore(db, subscriptions.WithSchema(s))
			require.NoError(t, err)
			lot, err := subscriptions.NewGormParkingLot(db, subscriptions.WithSchema(s))
			require.NoError(t, err)
			return subscriptions.Feed{Tenant: s, Database: "pg", Events: events, Checkpoints: cps, Parking: lot}
		}, project)
	})
	t.Run("pgx", func(t *testing.T) {
		t.Parallel()
		pg := dbtest.NewPostgres(t)
		var gauge socketGauge
		cfg, err := pgxpool.ParseConfig(pg.DSN)
		require.NoError(t, err)
		cfg.MaxConns = 8 // above the budget: the bound is the group's
		var dialer net.Dialer
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			gauge.opened()
			return &countedSocket{Conn: conn, gauge: &gauge}, nil
		}
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		ctx := context.Background()
		runSharedPoolGroup(t, pg, &gauge, func(s, channel string) subscriptions.Feed {
			events, err := pgxstore.NewEventStore(ctx, pool, pgxstore.WithSchema(s), pgxstore.WithNotifyChannel(channel))
			require.NoError(t, err)
			cps, err := pgxstore.NewCheckpointStore(ctx, pool, pgxstore.WithSchema(s))
			require.NoError(t, err)
			lot, err := pgxstore.NewParkingLot(ctx, pool, pgxstore.WithSchema(s))
			require.NoError(t, err)
			return subscriptions.Feed{Tenant: s, Database: "pg", Events: events, Checkpoints: cps, Parking: lot}
		}, func(ctx context.Context, table string, ev domain.EventEnvelope[any]) error {
			tx := pgxstore.TxFromContext(ctx)
			if tx == nil {
				return errors.New("no pgx batch transaction in the handler's context")
			}
			_, err := tx.Exec(ctx, "INSERT INTO "+table+" (event_id, position) VALUES ($1, $2)", ev.ID, ev.Position)
			return err
		})
	})
}

// runSharedPoolGroup is TestGroupTenantsShareOnePool on one backend:
// newFeed builds a tenant's stores on the counted pool (gauge) for a
// schema and NOTIFY channel, write writes an event into a table through
// the batch transaction.
func runSharedPoolGroup(t *testing.T, pg *dbtest.Postgres, gauge *socketGauge,
	newFeed func(schema, channel string) subscriptions.Feed,
	write func(ctx context.Context, table string, ev domain.EventEnvelope[any]) error) {
	const tenantsN, workers, backlog = 8, 2, 8
	admin := groupAdmin(t)
	channel := "grp_shared_" + strings.ToLower(pg.Schema)
	tables := []string{"shared_a", "shared_b"}
	type tenant struct {
		schema string
		feed   subscriptions.Feed
	}
	var tenants []tenant
	for range tenantsN {
		s := dbtest.NewSchema(t)
		feed := newFeed(s, channel)
		for _, table := range tables {
			require.NoError(t, admin.Exec("CREATE TABLE "+schema.Qualified(s, table)+" (event_id text NOT NULL, position bigint NOT NULL)").Error)
		}
		tenants = append(tenants, tenant{schema: s, feed: feed})
		appendN(t, feed.Events, "Backlog", 0, backlog)
	}
	var empty int64
	require.NoError(t, admin.Raw("SELECT count(*) FROM pg_tables WHERE schemaname = ?", pg.Schema).Scan(&empty).Error)
	require.Zero(t, empty, "the pool's own schema got no table")

	listener, err := subscriptions.NewPostgresListener(pg.DSN, subscriptions.WithListenerChannel(channel), subscriptions.WithListenerLogger(quietLogger()))
	require.NoError(t, err)
	lctx, stopListener := context.WithCancel(context.Background())
	listened := make(chan error, 1)
	go func() { listened <- listener.Run(lctx) }()
	t.Cleanup(func() { stopListener(); require.NoError(t, <-listened) })

	var calls atomic.Int64
	var defs []subscriptions.GroupSubscriber
	for i, table := range tables {
		opts := []subscriptions.SubscriberOption{subscriptions.WithPollInterval(groupPoll), subscriptions.WithBatchSize(3)}
		if i == 1 {
			opts = append(opts, subscriptions.WithPartitions(4), subscriptions.WithConcurrency(2))
		}
		defs = append(defs, subscriptions.GroupSubscriber{Name: table, Handler: func(ctx context.Context, ev domain.EventEnvelope[any]) error {
			calls.Add(1)
			return write(ctx, schema.Qualified(subscriptions.TenantFromContext(ctx), table), ev)
		}, Options: opts})
	}
	g, err := subscriptions.NewGroup(defs, subscriptions.WithGroupWorkers(workers),
		subscriptions.WithGroupPollInterval(groupPoll), subscriptions.WithGroupWakeSignal("pg", listener.Subscribe()),
		subscriptions.WithGroupLogger(quietLogger()))
	require.NoError(t, err)
	for _, tn := range tenants {
		require.NoError(t, g.Add(tn.feed))
	}
	gauge.max.Store(gauge.open.Load())
	runGroup(t, g)
	// The test reads through a pool of its own (admin), so that the shared
	// pool's sockets are the group's.
	feedIDs := func(tn tenant) []string {
		var ids []string
		require.NoError(t, admin.Raw("SELECT id FROM "+schema.Qualified(tn.schema, "events")+" ORDER BY position").Scan(&ids).Error)
		return ids
	}
	caughtUp := func(tn tenant) bool {
		for _, table := range tables {
			if len(projected(t, admin, schema.Qualified(tn.schema, table))) < len(feedIDs(tn)) {
				return false
			}
		}
		return true
	}
	require.Eventually(t, func() bool {
		for _, tn := range tenants {
			if !caughtUp(tn) {
				return false
			}
		}
		return true
	}, 60*time.Second, 10*time.Millisecond, "the tenants did not catch up")
	t.Logf("%d tenants on one pool, %d workers: at most %d connections open at once", tenantsN, workers, gauge.max.Load())
	require.LessOrEqual(t, gauge.max.Load(), int64(workers+1), "the shared pool had more open than workers + the probe")

	late := appendN(t, tenants[0].feed.Events, "Late", backlog, 1)
	require.Eventually(t, func() bool { return caughtUp(tenants[0]) }, 30*time.Second, 5*time.Millisecond, "the late append was not handled")
	for _, tn := range tenants {
		want, wantN := feedIDs(tn), backlog
		if tn.schema == tenants[0].schema {
			wantN++ // the late append
		}
		require.Len(t, want, wantN, "tenant %s's table holds its own events only", tn.schema)
		for _, table := range tables {
			faultRequireExactlyOnce(t, table+"/"+tn.schema, projected(t, admin, schema.Qualified(tn.schema, table)), want)
		}
	}
	require.Contains(t, projected(t, admin, schema.Qualified(tenants[0].schema, tables[0])), late[0])
	require.EqualValues(t, 2*(tenantsN*backlog+1), calls.Load(), "a handler call per event and definition, none repeated")
}
