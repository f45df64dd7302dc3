package pgfeed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/internal/feedtest"
)

// Store is one event store that appends to the Postgres events table.
type Store struct {
	// Name names the store in subtest names: "gorm", "pgx".
	Name string
	// New returns a store on pg's schema, released at the test's cleanup.
	// It builds on pg.DB or on a pool of its own opened on pg.DSN (say
	// pg.Open or pg.OpenPgx), never on another database.
	New func(t testing.TB, pg *dbtest.Postgres) domain.EventStore
	// Construct opens a pool of its own on pg.DSN (closed at cleanup), as
	// a separate process would have, and returns a function that builds a
	// store on it from any goroutine: the suite builds stores concurrently
	// with it, on an empty schema and while others append. Required of
	// the store under test; not used of the others.
	Construct func(t testing.TB, pg *dbtest.Postgres) func(ctx context.Context) (domain.EventStore, error)
}

// RunSuite runs the spec's ordered-feed tests against store on real
// Postgres: the forced interleaving with two connections (no read returns
// position 2 before 1 is visible), writers appending multi-event batches
// while a follower reads (every event once, strictly increasing, none
// missing), unrelated open transactions that must not delay ReadAfter, and
// the append lock's other cases. Each of others appends to the same
// events table too: the suite interleaves its appends with store's (as
// the second append behind a held one, and as half the writers the
// follower reads), so that mixed deployments keep one ordered feed.
func RunSuite(t *testing.T, store Store, others ...Store) {
	t.Run("feed never passes an uncommitted position", func(t *testing.T) {
		runNeverPassesUncommitted(t, store, others)
	})
	t.Run("follower reads every event once", func(t *testing.T) {
		t.Run(store.Name, func(t *testing.T) {
			pg := dbtest.NewPostgres(t)
			feedtest.RequireFollowerReadsEveryEventOnce(t, store.New(t, pg))
		})
		for _, o := range others {
			t.Run(store.Name+" and "+o.Name, func(t *testing.T) {
				pg := dbtest.NewPostgres(t)
				feedtest.RequireFollowerReadsEveryEventOnce(t, store.New(t, pg), o.New(t, pg))
			})
		}
	})
	for _, c := range []struct {
		name string
		run  func(*testing.T, Store)
	}{
		{"unrelated transactions do not delay the feed", runUnrelatedTransactions},
		{"queued append honours cancellation", runQueuedAppendCancellation},
		{"append under stricter default isolation", runStricterIsolation},
		{"schemas do not block each other", runSchemasDoNotBlock},
		{"transaction order ignores collation", runCollation},
		{"construction while appending", runConstructionWhileAppending},
		{"a failed commit stores nothing", runCommitFailure},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t, store) })
	}
}

// interleaving is one case of runNeverPassesUncommitted.
type interleaving struct {
	name string
	// bTakesXIDFirst opens B's transaction, on conn, before A starts.
	bTakesXIDFirst bool
	// startB begins the second append and returns its ID and outcome.
	startB func(t *testing.T, pg *dbtest.Postgres, s domain.EventStore, conn *pgx.Conn) (string, chan error)
}

// runNeverPassesUncommitted forces the interleaving of the spec with two
// connections: append A takes position 1 and stays open; append B comes
// next, through the store, through each of others on the same schema, or
// as a raw transaction that took its transaction id before A. While A is
// open, no read may return B's position, and B must not be able to commit
// a larger position; once A commits, both appear, in order.
func runNeverPassesUncommitted(t *testing.T, store Store, others []Store) {
	through := func(s domain.EventStore) (string, chan error) {
		b := feedtest.NewEvent("b", "second", "B")
		return b.ID, feedtest.Async(func() error { return s.Append(context.Background(), "b", 0, b) })
	}
	cases := []interleaving{{
		name: "second append through the store",
		startB: func(_ *testing.T, _ *dbtest.Postgres, s domain.EventStore, _ *pgx.Conn) (string, chan error) {
			return through(s)
		},
	}}
	for _, o := range others {
		cases = append(cases, interleaving{
			name: "second append through " + o.Name,
			startB: func(t *testing.T, pg *dbtest.Postgres, _ domain.EventStore, _ *pgx.Conn) (string, chan error) {
				return through(o.New(t, pg))
			},
		})
	}
	cases = append(cases, interleaving{
		// The spec's counterexample to the transaction-id guard: B takes
		// a transaction id before A, then does what an append does.
		name:           "second transaction took its id before the first",
		bTakesXIDFirst: true,
		startB: func(t *testing.T, _ *dbtest.Postgres, _ domain.EventStore, conn *pgx.Conn) (string, chan error) {
			key := AppendLockKey(t, conn)
			id := feedtest.UniqueID("raw-b")
			return id, feedtest.Async(func() error {
				ctx := context.Background()
				if _, err := conn.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", key); err != nil {
					return err
				}
				if _, err := conn.Exec(ctx, `INSERT INTO events (id, aggregate_id, event_type, sequence_no, position, payload, metadata, created_at)
					SELECT $1, 'b', 'second', 1, COALESCE(MAX(position), 0) + 1, '"B"', '{}', now() FROM events`, id); err != nil {
					return err
				}
				_, err := conn.Exec(ctx, "COMMIT")
				return err
			})
		},
	})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := feedtest.Context(t)
			pg := dbtest.NewPostgres(t)
			s := store.New(t, pg)
			gate := NewGate(t, pg)
			observer := Connect(t, pg.DSN)
			key := AppendLockKey(t, observer)

			var bConn *pgx.Conn
			if c.bTakesXIDFirst {
				bConn = Connect(t, pg.DSN)
				_, err := bConn.Exec(ctx, "BEGIN")
				require.NoError(t, err)
				var xid int64
				require.NoError(t, bConn.QueryRow(ctx, "SELECT txid_current()").Scan(&xid))
				require.Positive(t, xid)
			}

			watcher := feedtest.WatchFeed(t, s)
			a := feedtest.NewEvent("held-a", "first", "A")
			doneA := feedtest.Async(func() error { return s.Append(context.Background(), "held-a", 0, a) })
			gate.WaitHeld(t, 1)
			require.Equal(t, 1, AdvisoryLocks(t, observer, key, true), "the held append holds the append lock")

			idB, doneB := c.startB(t, pg, s, bConn)
			WaitForLockWaiters(t, observer, key, 1, "the second append")

			// A is uncommitted with position 1: nothing may be read.
			for range 3 {
				feed, err := s.ReadAfter(ctx, 0, 0)
				require.NoError(t, err)
				require.Empty(t, feed)
				head, err := s.HeadPosition(ctx)
				require.NoError(t, err)
				require.Zero(t, head)
			}
			before := watcher.Count()
			feedtest.Eventually(t, "the watcher reads while A is open", func() bool { return watcher.Count() > before })
			require.False(t, feedtest.Finished(doneA), "A is held at the gate")
			require.False(t, feedtest.Finished(doneB), "B cannot commit while A is open")

			gate.Release()
			require.NoError(t, feedtest.Result(t, doneA, "append A"))
			require.NoError(t, feedtest.Result(t, doneB, "append B"))

			feed, err := s.ReadAfter(ctx, 0, 0)
			require.NoError(t, err)
			require.Equal(t, []string{a.ID, idB}, feedtest.IDs(feed))
			require.Equal(t, []int64{1, 2}, feedtest.Positions(feed))

			feedtest.Eventually(t, "the watcher sees both events", func() bool { return len(watcher.Last()) == 2 })
			for i, read := range watcher.Finish(t) {
				require.Equal(t, []string{a.ID, idB}[:len(read)], read,
					"read #%d returned a position while a smaller one was not visible", i)
			}
		})
	}
}

// runUnrelatedTransactions keeps a transaction open on another connection
// and checks that appends and feed reads complete while it is still open.
func runUnrelatedTransactions(t *testing.T, store Store) {
	cases := []struct {
		name string
		stmt []string
	}{
		{"writes to another table", []string{"INSERT INTO other (id, v) VALUES (2, 'new')"}},
		{"subscriber-like: locks a checkpoint row", []string{"SELECT v FROM other WHERE id = 1 FOR UPDATE"}},
		{"updates a row of another table", []string{"UPDATE other SET v = 'changed' WHERE id = 1"}},
		{"holds a transaction id", []string{"SELECT txid_current()"}},
		{"long repeatable-read snapshot of the events", []string{"SET TRANSACTION ISOLATION LEVEL REPEATABLE READ", "SELECT COUNT(*) FROM events"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := feedtest.Context(t)
			pg := dbtest.NewPostgres(t)
			s := store.New(t, pg)
			admin := Connect(t, pg.DSN)
			_, err := admin.Exec(ctx, "CREATE TABLE other (id int PRIMARY KEY, v text)")
			require.NoError(t, err)
			_, err = admin.Exec(ctx, "INSERT INTO other (id, v) VALUES (1, 'old')")
			require.NoError(t, err)
			before := feedtest.NewEvent("before", "x", nil)
			require.NoError(t, s.Append(ctx, "before", 0, before))

			blocker := Connect(t, pg.DSN)
			_, err = blocker.Exec(ctx, "BEGIN")
			require.NoError(t, err)
			for _, stmt := range c.stmt {
				_, err := blocker.Exec(ctx, stmt)
				require.NoError(t, err)
			}
			var pid int
			require.NoError(t, blocker.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))

			ev := feedtest.NewEvent("during", "y", map[string]any{"n": 1})
			var feed []domain.EventEnvelope[any]
			var head int64
			done := feedtest.Async(func() error {
				if err := s.Append(ctx, "during", 0, ev); err != nil {
					return err
				}
				var err error
				if feed, err = s.ReadAfter(ctx, 0, 0); err != nil {
					return err
				}
				head, err = s.HeadPosition(ctx)
				return err
			})
			// The operations must finish while the blocker is still open:
			// it is only released below.
			require.NoError(t, feedtest.Result(t, done, "append and read with an unrelated transaction open"))
			require.Equal(t, []string{before.ID, ev.ID}, feedtest.IDs(feed))
			require.Equal(t, feed[1].Position, head)

			var state string
			require.NoError(t, admin.QueryRow(ctx, "SELECT state FROM pg_stat_activity WHERE pid = $1", pid).Scan(&state))
			require.Equal(t, "idle in transaction", state, "the unrelated transaction was open throughout")
			_, err = blocker.Exec(ctx, "COMMIT")
			require.NoError(t, err)
		})
	}
}

// runQueuedAppendCancellation cancels an append while it waits for the
// append lock behind a held one: it returns the context's error at once,
// the feed carries on, and retrying it is safe.
func runQueuedAppendCancellation(t *testing.T, store Store) {
	ctx := feedtest.Context(t)
	pg := dbtest.NewPostgres(t)
	s := store.New(t, pg)
	gate := NewGate(t, pg)
	observer := Connect(t, pg.DSN)

	held := feedtest.NewEvent("held", "x", nil)
	doneHeld := feedtest.Async(func() error { return s.Append(context.Background(), "held", 0, held) })
	gate.WaitHeld(t, 1)

	queuedCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	queued := feedtest.NewEvent("queued", "x", nil)
	doneQueued := feedtest.Async(func() error { return s.Append(queuedCtx, "queued", 0, queued) })
	WaitForLockWaiters(t, observer, AppendLockKey(t, observer), 1, "the queued append")
	cancel()
	require.ErrorIs(t, feedtest.Result(t, doneQueued, "the canceled append"), context.Canceled)
	require.False(t, feedtest.Finished(doneHeld), "the held append is still open")

	gate.Release()
	require.NoError(t, feedtest.Result(t, doneHeld, "the held append"))
	// The cancellation reaches the server asynchronously: on a loaded
	// machine the queued statement can still take the lock and commit once
	// the gate opens. Its caller was told so (a canceled Append's outcome is
	// unknown), and retrying the identical append is safe either way.
	if err := s.Append(ctx, "queued", 0, queued); err != nil {
		require.ErrorIs(t, err, domain.ErrAlreadyAppended, "the canceled append can be retried")
	}
	feed, err := s.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	require.Equal(t, []string{held.ID, queued.ID}, feedtest.IDs(feed), "each append stored exactly once, in order")
}

// WithDefaultIsolation is dsn with its sessions' default transaction
// isolation level set to level ("repeatable read", "serializable").
func WithDefaultIsolation(t testing.TB, dsn, level string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	// A space as %20: libpq's URI syntax takes "+" literally.
	param := "default_transaction_isolation=" + url.PathEscape(level)
	if u.RawQuery != "" {
		param = "&" + param
	}
	u.RawQuery += param
	var got string
	require.NoError(t, Connect(t, u.String()).QueryRow(feedtest.Context(t), "SHOW default_transaction_isolation").Scan(&got))
	require.Equal(t, level, got)
	return u.String()
}

// runStricterIsolation appends concurrently through a store whose
// sessions default to a stricter isolation level: the append transaction
// must still see every earlier append once it holds the lock, and never
// fail with a serialization error.
func runStricterIsolation(t *testing.T, store Store) {
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			ctx := feedtest.Context(t)
			pg := dbtest.NewPostgres(t)
			dsn := WithDefaultIsolation(t, pg.DSN, level)
			iso := &dbtest.Postgres{Schema: pg.Schema, DSN: dsn, DB: dbtest.OpenPostgresDSN(t, dsn)}
			s := store.New(t, iso)

			var wg sync.WaitGroup
			errs := make(chan error, 4)
			for w := range 4 {
				wg.Go(func() {
					agg := fmt.Sprintf("iso%d", w)
					for i := range 8 {
						if err := s.Append(ctx, agg, i, feedtest.NewEvent(agg, "x", i)); err != nil {
							errs <- err
							return
						}
					}
				})
			}
			feedtest.WaitNoErrors(t, &wg, errs)
			feed, err := s.ReadAfter(ctx, 0, 0)
			require.NoError(t, err)
			require.Len(t, feed, 32)
			require.Equal(t, int64(32), feed[len(feed)-1].Position)
			feedtest.RequireStrictlyIncreasing(t, feed)
		})
	}
}

// runCommitFailure makes the database refuse appends at their commit (a
// deferred constraint trigger): each such append fails with the
// database's error, neither a version conflict nor already appended, and
// stores nothing, whatever its size; the next append takes the next
// position.
func runCommitFailure(t *testing.T, store Store) {
	ctx := feedtest.Context(t)
	pg := dbtest.NewPostgres(t)
	s := store.New(t, pg)
	before := feedtest.NewEvent("before", "x", nil)
	require.NoError(t, s.Append(ctx, "before", 0, before))
	conn := Connect(t, pg.DSN)
	_, err := conn.Exec(ctx, `CREATE FUNCTION refuse_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'refused at commit by test trigger'; END $$`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `CREATE CONSTRAINT TRIGGER refuse_commit AFTER INSERT ON events
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
		WHEN (NEW.aggregate_id LIKE 'refused%') EXECUTE FUNCTION refuse_commit()`)
	require.NoError(t, err)
	for _, n := range []int{1, 3} {
		agg := fmt.Sprintf("refused-%d", n)
		events := make([]domain.EventEnvelope[any], n)
		for i := range events {
			events[i] = feedtest.NewEvent(agg, "x", i)
		}
		err := s.Append(ctx, agg, 0, events...)
		require.ErrorContains(t, err, "refused at commit by test trigger", "%d event(s)", n)
		require.ErrorContains(t, err, agg)
		require.NotErrorIs(t, err, domain.ErrConcurrencyConflict)
		require.NotErrorIs(t, err, domain.ErrAlreadyAppended)
		version, err := s.GetCurrentVersion(ctx, agg)
		require.NoError(t, err)
		require.Zero(t, version, "%d event(s): nothing stored", n)
	}
	after := feedtest.NewEvent("after", "x", nil)
	require.NoError(t, s.Append(ctx, "after", 0, after))
	feed, err := s.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	require.Equal(t, []string{before.ID, after.ID}, feedtest.IDs(feed))
	require.Equal(t, []int64{1, 2}, feedtest.Positions(feed))
}

// runSchemasDoNotBlock holds an append open in one schema: appends and
// reads in another schema proceed.
func runSchemasDoNotBlock(t *testing.T, store Store) {
	ctx := feedtest.Context(t)
	pgA, pgB := dbtest.NewPostgres(t), dbtest.NewPostgres(t)
	storeA, storeB := store.New(t, pgA), store.New(t, pgB)
	require.NotEqual(t, AppendLockKey(t, Connect(t, pgA.DSN)), AppendLockKey(t, Connect(t, pgB.DSN)))

	gate := NewGate(t, pgA)
	held := feedtest.NewEvent("held-a", "x", nil)
	doneA := feedtest.Async(func() error { return storeA.Append(context.Background(), "held-a", 0, held) })
	gate.WaitHeld(t, 1)

	for i := range 3 {
		require.NoError(t, storeB.Append(ctx, "b", i, feedtest.NewEvent("b", "y", i)))
	}
	feedB, err := storeB.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2, 3}, feedtest.Positions(feedB))
	feedA, err := storeA.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	require.Empty(t, feedA)
	require.False(t, feedtest.Finished(doneA), "schema A's append was held throughout")

	gate.Release()
	require.NoError(t, feedtest.Result(t, doneA, "held append in schema A"))
	feedA, err = storeA.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	require.Equal(t, []string{held.ID}, feedtest.IDs(feedA))
}

// runCollation gives the aggregate_id column a linguistic collation, under
// which "B" sorts after "a": GetEventsByTransactionID still orders
// aggregate IDs by their bytes, as MemoryStore and SQLite do.
func runCollation(t *testing.T, store Store) {
	ctx := feedtest.Context(t)
	pg := dbtest.NewPostgres(t)
	s := store.New(t, pg)
	admin := Connect(t, pg.DSN)
	var icu bool
	require.NoError(t, admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_collation WHERE collname = 'und-x-icu')").Scan(&icu))
	if !icu {
		t.Skip("the server has no ICU collation")
	}
	_, err := admin.Exec(ctx, `ALTER TABLE events ALTER COLUMN aggregate_id TYPE text COLLATE "und-x-icu"`)
	require.NoError(t, err)
	for _, agg := range []string{"a", "B", "b", "A"} {
		e := feedtest.NewEvent(agg, "x", nil)
		e.TransactionID = "tx"
		require.NoError(t, s.Append(ctx, agg, 0, e))
	}
	got, err := s.GetEventsByTransactionID(ctx, "tx")
	require.NoError(t, err)
	aggs := make([]string, len(got))
	for i, e := range got {
		aggs[i] = e.AggregateID
	}
	require.Equal(t, []string{"A", "B", "a", "b"}, aggs)
}

// runConstructionWhileAppending constructs stores concurrently, on
// separate pools as separate processes would, while others append.
func runConstructionWhileAppending(t *testing.T, store Store) {
	require.NotNil(t, store.Construct, "the store under test has a Construct")
	t.Run("concurrent first construction on an empty schema", func(t *testing.T) {
		ctx := feedtest.Context(t)
		pg := dbtest.NewPostgres(t)
		const procs = 4
		constructors := make([]func(context.Context) (domain.EventStore, error), procs)
		for i := range constructors {
			constructors[i] = store.Construct(t, pg)
		}
		start := make(chan struct{})
		errs := make(chan error, procs)
		var wg sync.WaitGroup
		for i, construct := range constructors {
			wg.Go(func() {
				<-start
				agg := fmt.Sprintf("proc%d", i)
				for round := range 3 {
					c, err := construct(ctx)
					if err == nil {
						err = c.Append(ctx, agg, round, feedtest.NewEvent(agg, "x", round))
						err = errors.Join(err, closeStore(c))
					}
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
		close(start)
		feedtest.WaitNoErrors(t, &wg, errs)
		feed, err := store.New(t, pg).ReadAfter(ctx, 0, 0)
		require.NoError(t, err)
		require.Len(t, feed, procs*3)
		feedtest.RequireStrictlyIncreasing(t, feed)
	})

	t.Run("construction while writers append", func(t *testing.T) {
		ctx := feedtest.Context(t)
		pg := dbtest.NewPostgres(t)
		s := store.New(t, pg)
		constructors := make([]func(context.Context) (domain.EventStore, error), 3)
		for i := range constructors {
			constructors[i] = store.Construct(t, pg)
		}
		var (
			constructing atomic.Int32
			appends      atomic.Int32
			wg           sync.WaitGroup
			errs         = make(chan error, 16)
		)
		constructing.Store(int32(len(constructors)))
		for w := range 3 {
			wg.Go(func() {
				agg := fmt.Sprintf("writer%d", w)
				// Keep appending until every constructor is done, and at
				// least a few times.
				for i := 0; i < 5 || constructing.Load() > 0; i++ {
					if err := s.Append(ctx, agg, 2*i, feedtest.NewEvent(agg, "x", i), feedtest.NewEvent(agg, "x", i)); err != nil {
						errs <- err
						return
					}
					appends.Add(1)
				}
			})
		}
		for _, construct := range constructors {
			wg.Go(func() {
				defer constructing.Add(-1)
				for range 5 {
					c, err := construct(ctx)
					if err == nil {
						_, err = c.HeadPosition(ctx)
						err = errors.Join(err, closeStore(c))
					}
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
		feedtest.WaitNoErrors(t, &wg, errs)
		feed, err := s.ReadAfter(ctx, 0, 0)
		require.NoError(t, err)
		require.Len(t, feed, 2*int(appends.Load()))
		feedtest.RequireStrictlyIncreasing(t, feed)
	})
}

// closeStore closes s if it has a Close method.
func closeStore(s domain.EventStore) error {
	if c, ok := s.(io.Closer); ok {
		return c.Close()
	}
	return nil
}
