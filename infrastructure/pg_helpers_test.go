package infrastructure_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/migrations/schema"
)

// pgConnect opens a single raw connection on dsn, closed at cleanup: a
// second client, independent of any pool under test.
func pgConnect(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	ctx := testCtx(t)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// appendLockKey is the advisory-lock key GormEventStore takes for appends
// to the events table of conn's search_path: schema.LockKey of the table's
// schema-qualified name as quote_ident gives it.
func appendLockKey(t testing.TB, conn *pgx.Conn) int64 {
	t.Helper()
	var qualified string
	require.NoError(t, conn.QueryRow(testCtx(t), `SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = to_regclass('events')`).Scan(&qualified))
	return schema.LockKey("append", qualified)
}

// advisoryLocks counts the advisory locks on key in the current database,
// granted or waiting.
func advisoryLocks(t testing.TB, conn *pgx.Conn, key int64, granted bool) int {
	t.Helper()
	var n int
	require.NoError(t, conn.QueryRow(testCtx(t), `SELECT COUNT(*) FROM pg_locks
		WHERE locktype = 'advisory' AND granted = $1
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND classid::bigint = $2 AND objid::bigint = $3 AND objsubid = 1`,
		granted, int64(uint32(uint64(key)>>32)), int64(uint32(key))).Scan(&n))
	return n
}

// waitForLockWaiters waits until n sessions are queued for the advisory
// lock key.
func waitForLockWaiters(t testing.TB, conn *pgx.Conn, key int64, n int, who string) {
	t.Helper()
	eventually(t, fmt.Sprintf("%s waits for advisory lock %d", who, key), func() bool {
		return advisoryLocks(t, conn, key, false) >= n
	})
}

// appendGate holds appends mid-transaction: a trigger on the events table
// of one schema makes every insert of an aggregate whose ID starts with
// "held" wait for a lock the gate holds. Such an append has taken the
// append lock and its position, inserted its rows, and not committed: the
// exact state the ordered feed must never read past.
type appendGate struct {
	conn *pgx.Conn // holds the gate lock
	key  int64
	open bool
}

// newAppendGate installs the trigger in pg's schema (the events table must
// exist) and closes the gate.
func newAppendGate(t testing.TB, pg *dbtest.Postgres) *appendGate {
	t.Helper()
	ctx := testCtx(t)
	g := &appendGate{conn: pgConnect(t, pg.DSN), key: schema.LockKey("test-gate", pg.Schema)}
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
	t.Cleanup(g.release)
	return g
}

// waitHeld waits until n appends are held at the gate.
func (g *appendGate) waitHeld(t testing.TB, n int) {
	t.Helper()
	waitForLockWaiters(t, g.conn, g.key, n, "a held append")
}

// release lets held appends commit.
func (g *appendGate) release() {
	if g.open {
		return
	}
	g.open = true
	_, _ = g.conn.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", g.key)
}

// result waits for an asynchronous operation's error.
func result(t testing.TB, done <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-testCtx(t).Done():
		t.Fatalf("%s did not finish", what)
		return nil
	}
}

// finished reports whether the operation has already finished, without
// waiting; the error, if any, is put back for result.
func finished(done chan error) bool {
	select {
	case err := <-done:
		done <- err
		return true
	default:
		return false
	}
}

func goAsync(f func() error) chan error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	return done
}
