package subscriptions_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// coreCounter counts the statements and transactions that go through a
// coreCountingPool.
type coreCounter struct {
	mu         sync.Mutex
	statements []string
	begins     int
}

func (c *coreCounter) statement(query string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.statements = append(c.statements, strings.Join(strings.Fields(query), " "))
}

func (c *coreCounter) begin() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.begins++
}

func (c *coreCounter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.statements, c.begins = nil, 0
}

func (c *coreCounter) snapshot() (statements []string, begins int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.statements...), c.begins
}

// coreCountingDB opens a Postgres pool on pg's schema whose driver
// connections count every statement and every BEGIN into c, whichever way
// the module reaches them (the *gorm.DB, a pinned *sql.Conn, a
// transaction). The wrapper hides pgx, so the pipelined paths are not
// taken: every statement is one the counter sees.
func coreCountingDB(t testing.TB, pg *dbtest.Postgres, c *coreCounter) *gorm.DB {
	t.Helper()
	config, err := pgx.ParseConfig(pg.DSN)
	require.NoError(t, err)
	sqlDB := sql.OpenDB(&coreCountingConnector{Connector: stdlib.GetConnector(*config), c: c})
	t.Cleanup(func() { _ = sqlDB.Close() })
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	require.Equal(t, "postgres", db.Name())
	return db
}

type coreCountingConnector struct {
	driver.Connector
	c *coreCounter
}

func (k *coreCountingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := k.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &coreCountingConn{inner: conn, c: k.c}, nil
}

// coreCountingConn forwards to pgx's driver connection, counting.
type coreCountingConn struct {
	inner driver.Conn
	c     *coreCounter
}

func (k *coreCountingConn) Prepare(query string) (driver.Stmt, error) {
	k.c.statement(query)
	return k.inner.Prepare(query)
}
func (k *coreCountingConn) Close() error { return k.inner.Close() }
func (k *coreCountingConn) Begin() (driver.Tx, error) {
	return k.BeginTx(context.Background(), driver.TxOptions{})
}

func (k *coreCountingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	k.c.begin()
	return k.inner.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

func (k *coreCountingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	k.c.statement(query)
	return k.inner.(driver.ExecerContext).ExecContext(ctx, query, args)
}

func (k *coreCountingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	k.c.statement(query)
	return k.inner.(driver.QueryerContext).QueryContext(ctx, query, args)
}

func (k *coreCountingConn) CheckNamedValue(v *driver.NamedValue) error {
	return k.inner.(driver.NamedValueChecker).CheckNamedValue(v)
}

func (k *coreCountingConn) ResetSession(ctx context.Context) error {
	return k.inner.(driver.SessionResetter).ResetSession(ctx)
}

func (k *coreCountingConn) Ping(ctx context.Context) error { return k.inner.(driver.Pinger).Ping(ctx) }

// TestSubscriberIdlePollIsCheap: on Postgres an idle poll costs at most two
// statements (the checkpoint and the feed) and opens no transaction.
func TestSubscriberIdlePollIsCheap(t *testing.T) {
	pg := dbtest.NewPostgres(t)
	counter := &coreCounter{}
	db := coreCountingDB(t, pg, counter)

	events, err := infrastructure.NewGormEventStore(db)
	require.NoError(t, err)
	cps, err := subscriptions.NewGormCheckpointStore(db)
	require.NoError(t, err)
	appendN(t, events, "core.idle", 0, 5)

	// The counter works: a batch is a transaction with statements in it.
	// (The row exists first: a subscriber's very first Acquire also
	// creates it, in a statement of its own.)
	require.NoError(t, cps.Reset(context.Background(), "core-probe", 0))
	counter.reset()
	batch, acquired, err := cps.Acquire(context.Background(), "core-probe")
	require.NoError(t, err)
	require.True(t, acquired)
	require.NoError(t, batch.Rollback())
	stmts, begins := counter.snapshot()
	require.Equal(t, 1, begins)
	require.NotEmpty(t, stmts)

	const name = "core-idle"
	sub := coreNewSub(t, name, events, cps, func(context.Context, coreEnvelope) error { return nil },
		subscriptions.WithPollInterval(20*time.Millisecond))
	run := start(t, sub)
	// Caught up, watched through the other pool so as not to count it.
	require.Eventually(t, func() bool {
		var pos int64
		return pg.DB.Raw("SELECT position FROM subscriber_checkpoints WHERE subscriber = ?", name).Scan(&pos).Error == nil && pos == 5
	}, 30*time.Second, 5*time.Millisecond)

	counter.reset()
	polls := func() int {
		stmts, _ := counter.snapshot()
		n := 0
		for _, s := range stmts {
			if strings.Contains(s, "subscriber_checkpoints") {
				n++
			}
		}
		return n
	}
	require.Eventually(t, func() bool { return polls() >= 10 }, 30*time.Second, 5*time.Millisecond)
	run.stop(t)

	stmts, begins = counter.snapshot()
	n := polls()
	t.Logf("%d idle polls: %d statements, %d transactions", n, len(stmts), begins)
	require.Zero(t, begins, "an idle poll must not open a transaction: %q", stmts)
	// The window may cut one poll in two.
	require.LessOrEqual(t, len(stmts), 2*n+1, "more than 2 statements per idle poll: %q", stmts)
	for _, s := range stmts {
		require.NotContains(t, strings.ToUpper(s), "FOR UPDATE", "an idle poll must not lock: %q", s)
		require.True(t, strings.Contains(s, "subscriber_checkpoints") || strings.Contains(s, "events"), "unexpected statement %q", s)
	}
}
