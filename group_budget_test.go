package subscriptions_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
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
