package pgxstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/internal/feedtest"
	"github.com/eventfeed/subscriptions/migrations/schema"
)

// The event store tests' helpers; their names say "feed" or "raw" so that
// they do not collide with the other files' of this package.

// rawConn opens a single connection on dsn, closed at cleanup: a second
// client, independent of any pool under test.
func rawConn(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(testCtx(t), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// feedLockKey is the append lock's key of the events table on conn's
// search_path, computed as infrastructure's tests compute it.
func feedLockKey(t testing.TB, conn *pgx.Conn) int64 {
	t.Helper()
	var qualified string
	require.NoError(t, conn.QueryRow(testCtx(t), `SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = to_regclass('events')`).Scan(&qualified))
	return schema.LockKey("append", qualified)
}

// feedLocks counts the advisory locks on key in the current database,
// granted or waiting.
func feedLocks(t testing.TB, conn *pgx.Conn, key int64, granted bool) int {
	t.Helper()
	var n int
	require.NoError(t, conn.QueryRow(testCtx(t), `SELECT COUNT(*) FROM pg_locks
		WHERE locktype = 'advisory' AND granted = $1
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND classid::bigint = $2 AND objid::bigint = $3 AND objsubid = 1`,
		granted, int64(uint32(uint64(key)>>32)), int64(uint32(key))).Scan(&n))
	return n
}

// waitFeedLockWaiters waits until n sessions are queued for key.
func waitFeedLockWaiters(t testing.TB, conn *pgx.Conn, key int64, n int, who string) {
	t.Helper()
	feedEventually(t, fmt.Sprintf("%s waits for advisory lock %d", who, key), func() bool {
		return feedLocks(t, conn, key, false) >= n
	})
}

// feedEventually polls cond until it holds, failing at the test
// context's deadline.
func feedEventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	ctx := testCtx(t)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting: %s", what)
		case <-tick.C:
		}
	}
}

// feedGate holds appends mid-transaction: a trigger on the events table
// makes every insert of an aggregate whose ID starts with "held" wait for
// a lock the gate holds. Such an append has taken the append lock and its
// positions, inserted its rows, and not committed: the state the ordered
// feed must never read past.
type feedGate struct {
	conn *pgx.Conn
	key  int64
	once sync.Once
}

// newFeedGate installs the trigger in pg's schema (the events table must
// exist) and closes the gate.
func newFeedGate(t testing.TB, pg *dbtest.Postgres) *feedGate {
	t.Helper()
	ctx := testCtx(t)
	g := &feedGate{conn: rawConn(t, pg.DSN), key: schema.LockKey("test-gate", pg.Schema)}
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
func (g *feedGate) waitHeld(t testing.TB, n int) {
	t.Helper()
	waitFeedLockWaiters(t, g.conn, g.key, n, "a held append")
}

// release lets held appends commit.
func (g *feedGate) release() {
	g.once.Do(func() { _, _ = g.conn.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", g.key) })
}

// feedAsync runs f on a goroutine; its error arrives on the channel.
func feedAsync(f func() error) chan error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	return done
}

// feedResult waits for an asynchronous operation's error.
func feedResult(t testing.TB, done <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-testCtx(t).Done():
		t.Fatalf("%s did not finish", what)
		return nil
	}
}

// feedFinished reports whether the operation has finished, without
// waiting; the error is put back for feedResult.
func feedFinished(done chan error) bool {
	select {
	case err := <-done:
		done <- err
		return true
	default:
		return false
	}
}

// feedWatcher reads the whole feed in a loop and records every answer,
// so that a test can check that no read ever saw a position before a
// smaller one was visible.
type feedWatcher struct {
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
	mu    sync.Mutex
	reads [][]string
	err   error
}

func watchFeed(t testing.TB, s domain.EventStore) *feedWatcher {
	w := &feedWatcher{stop: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(w.halt)
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.stop:
				return
			default:
			}
			feed, err := s.ReadAfter(context.Background(), 0, 0)
			w.mu.Lock()
			if err != nil {
				w.err = err
				w.mu.Unlock()
				return
			}
			w.reads = append(w.reads, feedtest.IDs(feed))
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *feedWatcher) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.reads)
}

func (w *feedWatcher) last() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.reads) == 0 {
		return nil
	}
	return w.reads[len(w.reads)-1]
}

func (w *feedWatcher) halt() {
	w.once.Do(func() { close(w.stop) })
	<-w.done
}

// finish stops the watcher and returns every read it made.
func (w *feedWatcher) finish(t testing.TB) [][]string {
	t.Helper()
	w.halt()
	require.NoError(t, w.err)
	return w.reads
}
