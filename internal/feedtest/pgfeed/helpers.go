// Package pgfeed holds the Postgres half of package feedtest: the helpers
// that watch the append lock from a connection of their own and hold
// appends mid-transaction, and RunSuite, the ordered-feed tests of the
// spec ("The ordered feed: a hazard to avoid") that every event store on
// the Postgres events table passes, alone and interleaved with the others.
//
// It is a package of its own, not part of feedtest, because it imports
// dbtest (and with it GORM's drivers and SQLite), which the exported
// suites in subscriptionstest, importing feedtest, must not pull in. Like
// feedtest it is test support only.
package pgfeed

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/internal/feedtest"
	"github.com/eventfeed/subscriptions/migrations/schema"
)

// Connect opens a single raw connection on dsn, closed at cleanup: a
// second client, independent of any pool under test.
func Connect(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(feedtest.Context(t), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// AppendLockKey is the advisory-lock key the event stores take for
// appends to the events table of conn's search_path: schema.LockKey of
// the table's schema-qualified name as quote_ident gives it.
func AppendLockKey(t testing.TB, conn *pgx.Conn) int64 {
	t.Helper()
	var qualified string
	require.NoError(t, conn.QueryRow(feedtest.Context(t), `SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = to_regclass('events')`).Scan(&qualified))
	return schema.LockKey("append", qualified)
}

// AdvisoryLocks counts the advisory locks on key in the current database,
// granted or waiting.
func AdvisoryLocks(t testing.TB, conn *pgx.Conn, key int64, granted bool) int {
	t.Helper()
	var n int
	require.NoError(t, conn.QueryRow(feedtest.Context(t), `SELECT COUNT(*) FROM pg_locks
		WHERE locktype = 'advisory' AND granted = $1
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND classid::bigint = $2 AND objid::bigint = $3 AND objsubid = 1`,
		granted, int64(uint32(uint64(key)>>32)), int64(uint32(key))).Scan(&n))
	return n
}

// WaitForLockWaiters waits until n sessions are queued for the advisory
// lock key, failing at the test context's deadline.
func WaitForLockWaiters(t testing.TB, conn *pgx.Conn, key int64, n int, who string) {
	t.Helper()
	feedtest.Eventually(t, fmt.Sprintf("%s waits for advisory lock %d", who, key), func() bool {
		return AdvisoryLocks(t, conn, key, false) >= n
	})
}

// Gate holds appends mid-transaction: a trigger on the events table of
// one schema makes every insert of an aggregate whose ID starts with
// "held" wait for a lock the gate holds. Such an append has taken the
// append lock and its positions, inserted its rows, and not committed:
// the exact state the ordered feed must never read past.
type Gate struct {
	conn *pgx.Conn // holds the gate lock
	key  int64
	once sync.Once
}

// NewGate installs the trigger in pg's schema (the events table must
// exist) and closes the gate; it opens at Release or at cleanup.
func NewGate(t testing.TB, pg *dbtest.Postgres) *Gate {
	t.Helper()
	ctx := feedtest.Context(t)
	g := &Gate{conn: Connect(t, pg.DSN), key: schema.LockKey("test-gate", pg.Schema)}
	_, err := g.conn.Exec(ctx, fmt.Sprintf(`CREATE FUNCTION hold_append() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			PERFORM pg_advisory_xact_lock_shared(%d);
			RETURN NEW;
		END $$`, g.key))
	require.NoError(t, err)
	_, err = g.conn.Exec(ctx, `CREATE TRIGGER hold_append AFTER INSERT ON events FOR EACH ROW
		WHEN (NEW.aggregate_id LIKE 'held%') EXECUTE FUNCTION hold_append()`)
	require.NoError(t, err)
	_, err = g.conn.Exec(ctx, "SELECT pg_advisory_lock($1)", g.key)
	require.NoError(t, err)
	t.Cleanup(g.Release)
	return g
}

// WaitHeld waits until n appends are held at the gate.
func (g *Gate) WaitHeld(t testing.TB, n int) {
	t.Helper()
	WaitForLockWaiters(t, g.conn, g.key, n, "a held append")
}

// Release lets held appends commit. It may be called more than once.
func (g *Gate) Release() {
	g.once.Do(func() { _, _ = g.conn.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", g.key) })
}
