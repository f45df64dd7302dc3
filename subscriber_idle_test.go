package subscriptions_test

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"testing"
	"time"

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

// coreCountingPool is a gorm.ConnPool over a *sql.DB that counts every
// statement and every BEGIN, including those inside transactions.
type coreCountingPool struct {
	db *sql.DB
	c  *coreCounter
}

func (p *coreCountingPool) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	p.c.statement(query)
	return p.db.PrepareContext(ctx, query)
}

func (p *coreCountingPool) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	p.c.statement(query)
	return p.db.ExecContext(ctx, query, args...)
}

func (p *coreCountingPool) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	p.c.statement(query)
	return p.db.QueryContext(ctx, query, args...)
}

func (p *coreCountingPool) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	p.c.statement(query)
	return p.db.QueryRowContext(ctx, query, args...)
}

func (p *coreCountingPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	p.c.begin()
	tx, err := p.db.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &coreCountingTx{tx: tx, c: p.c}, nil
}

func (p *coreCountingPool) GetDBConn() (*sql.DB, error) { return p.db, nil }

type coreCountingTx struct {
	tx *sql.Tx
	c  *coreCounter
}

func (t *coreCountingTx) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	t.c.statement(query)
	return t.tx.PrepareContext(ctx, query)
}

func (t *coreCountingTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	t.c.statement(query)
	return t.tx.ExecContext(ctx, query, args...)
}

func (t *coreCountingTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	t.c.statement(query)
	return t.tx.QueryContext(ctx, query, args...)
}

func (t *coreCountingTx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	t.c.statement(query)
	return t.tx.QueryRowContext(ctx, query, args...)
}

func (t *coreCountingTx) Commit() error   { return t.tx.Commit() }
func (t *coreCountingTx) Rollback() error { return t.tx.Rollback() }

// TestSubscriberIdlePollIsCheap: on Postgres an idle poll costs at most two
// statements (the checkpoint and the feed) and opens no transaction.
func TestSubscriberIdlePollIsCheap(t *testing.T) {
	pg := dbtest.NewPostgres(t)
	sqlDB, err := pg.Open(t).DB()
	require.NoError(t, err)
	counter := &coreCounter{}
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: &coreCountingPool{db: sqlDB, c: counter}}),
		&gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	require.Equal(t, "postgres", db.Name())

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
