package infrastructure_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// feedWatcher reads the whole feed in a loop on its own goroutine and
// records every answer, so a test can check that no read, at any moment,
// ever saw a position before a smaller one became visible.
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
	t.Cleanup(w.halt) // a test that fails early must not leak the watcher
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
			w.reads = append(w.reads, ids(feed))
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

// TestPostgresFeedNeverPassesAnUncommittedPosition forces the interleaving
// of the spec with two connections: append A takes position 1 and stays
// open; append B (on another connection) comes next. While A is open, no
// read may return B's position, and B must not be able to commit a larger
// position; once A commits, both appear, in order.
func TestPostgresFeedNeverPassesAnUncommittedPosition(t *testing.T) {
	cases := []struct {
		name string
		// startB begins the second append and returns its ID and outcome.
		startB func(t *testing.T, pg *dbtest.Postgres, s domain.EventStore, beforeA *pgx.Conn) (string, chan error)
		// beforeA, when set, opens B's transaction before A starts.
		bTakesXIDFirst bool
	}{
		{
			name: "second append through the store",
			startB: func(t *testing.T, pg *dbtest.Postgres, s domain.EventStore, _ *pgx.Conn) (string, chan error) {
				b := newEvent("b", "second", "B")
				return b.ID, goAsync(func() error { return s.Append(context.Background(), "b", 0, b) })
			},
		},
		{
			// The spec's counterexample to the transaction-id guard: B takes
			// a transaction id before A, then does what an append does.
			name:           "second transaction took its id before the first",
			bTakesXIDFirst: true,
			startB: func(t *testing.T, pg *dbtest.Postgres, s domain.EventStore, conn *pgx.Conn) (string, chan error) {
				key := appendLockKey(t, conn)
				id := uniqueID("raw-b")
				return id, goAsync(func() error {
					ctx := context.Background()
					if _, err := conn.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", key); err != nil {
						return err
					}
					_, err := conn.Exec(ctx, `INSERT INTO events (id, aggregate_id, event_type, sequence_no, position, payload, metadata, created_at)
						SELECT $1, 'b', 'second', 1, COALESCE(MAX(position), 0) + 1, '"B"', '{}', now() FROM events`, id)
					if err != nil {
						return err
					}
					_, err = conn.Exec(ctx, "COMMIT")
					return err
				})
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := testCtx(t)
			pg := dbtest.NewPostgres(t)
			store := newGormStore(t, pg.DB)
			gate := newAppendGate(t, pg)
			observer := pgConnect(t, pg.DSN)
			appendKey := appendLockKey(t, observer)

			var bConn *pgx.Conn
			if c.bTakesXIDFirst {
				bConn = pgConnect(t, pg.DSN)
				_, err := bConn.Exec(ctx, "BEGIN")
				require.NoError(t, err)
				var xid int64
				require.NoError(t, bConn.QueryRow(ctx, "SELECT txid_current()").Scan(&xid))
				require.Positive(t, xid)
			}

			watcher := watchFeed(t, store)
			a := newEvent("held-a", "first", "A")
			doneA := goAsync(func() error { return store.Append(context.Background(), "held-a", 0, a) })
			gate.waitHeld(t, 1)
			require.Equal(t, 1, advisoryLocks(t, observer, appendKey, true), "the held append holds the append lock")

			idB, doneB := c.startB(t, pg, store, bConn)
			waitForLockWaiters(t, observer, appendKey, 1, "the second append")

			// A is uncommitted with position 1: nothing may be read.
			for range 3 {
				feed, err := store.ReadAfter(ctx, 0, 0)
				require.NoError(t, err)
				require.Empty(t, feed)
				head, err := store.HeadPosition(ctx)
				require.NoError(t, err)
				require.Zero(t, head)
			}
			readsBefore := watcher.count()
			eventually(t, "the watcher reads while A is open", func() bool { return watcher.count() > readsBefore })
			require.False(t, finished(doneA), "A is held at the gate")
			require.False(t, finished(doneB), "B cannot commit while A is open")

			gate.release()
			require.NoError(t, result(t, doneA, "append A"))
			require.NoError(t, result(t, doneB, "append B"))

			feed, err := store.ReadAfter(ctx, 0, 0)
			require.NoError(t, err)
			require.Equal(t, []string{a.ID, idB}, ids(feed))
			require.Equal(t, []int64{1, 2}, positions(feed))

			eventually(t, "the watcher sees both events", func() bool {
				watcher.mu.Lock()
				defer watcher.mu.Unlock()
				return len(watcher.reads) > 0 && len(watcher.reads[len(watcher.reads)-1]) == 2
			})
			for i, read := range watcher.finish(t) {
				require.Equal(t, []string{a.ID, idB}[:len(read)], read,
					"read #%d returned a position while a smaller one was not visible", i)
			}
		})
	}
}

// TestFeedFollowerReadsEveryEventOnce appends multi-event batches from
// many goroutines while a follower pages through the feed as a subscriber
// does: every event is read exactly once, in strictly increasing
// positions, none missing.
func TestFeedFollowerReadsEveryEventOnce(t *testing.T) {
	t.Parallel() // every backend opens a store of its own
	const (
		writers          = 8
		appendsPerWriter = 10
		pageSize         = 50
	)
	for _, b := range storeBackends() {
		t.Run(b.name, func(t *testing.T) {
			ctx := testCtx(t)
			s := b.open(t)

			var (
				mu       sync.Mutex
				appended = map[string]bool{}
				wg       sync.WaitGroup
				failures = make(chan error, writers)
				writing  atomic.Int32
			)
			writing.Store(writers)
			for w := range writers {
				wg.Go(func() {
					defer writing.Add(-1)
					rng := rand.New(rand.NewPCG(uint64(w), 7))
					agg := uniqueID(fmt.Sprintf("writer%d", w))
					for i := range appendsPerWriter {
						batch := make([]domain.EventEnvelope[any], 1+rng.IntN(10))
						for j := range batch {
							batch[j] = newEvent(agg, "batch.item", map[string]any{"w": w, "i": i, "j": j})
						}
						version, err := s.GetCurrentVersion(ctx, agg)
						if err == nil {
							err = s.Append(ctx, agg, version, batch...)
						}
						if err != nil {
							failures <- err
							return
						}
						mu.Lock()
						for _, e := range batch {
							appended[e.ID] = true
						}
						mu.Unlock()
					}
				})
			}

			// The follower: checkpoint the last position, never look back.
			var (
				last      int64
				delivered []string
				seen      = map[string]bool{}
			)
			for {
				doneWriting := writing.Load() == 0
				page, err := s.ReadAfter(ctx, last, pageSize)
				require.NoError(t, err)
				require.LessOrEqual(t, len(page), pageSize)
				for _, e := range page {
					require.Greater(t, e.Position, last, "positions strictly increase along the feed")
					require.False(t, seen[e.ID], "event %s delivered twice", e.ID)
					seen[e.ID] = true
					last = e.Position
					delivered = append(delivered, e.ID)
				}
				if len(page) == 0 && doneWriting {
					break // nothing was in flight when this empty page was read
				}
			}
			wg.Wait()
			close(failures)
			for err := range failures {
				require.NoError(t, err)
			}

			all, err := s.ReadAfter(ctx, 0, 0)
			require.NoError(t, err)
			require.Equal(t, ids(all), delivered, "the follower saw the whole feed, in order")
			require.Len(t, delivered, len(appended))
			for _, id := range delivered {
				require.True(t, appended[id], "event %s was delivered but not appended", id)
			}
			head, err := s.HeadPosition(ctx)
			require.NoError(t, err)
			require.Equal(t, last, head)
		})
	}
}

// TestPostgresUnrelatedTransactionsDoNotDelayTheFeed keeps a transaction
// open on another connection and checks that appends and feed reads
// complete while it is still open.
func TestPostgresUnrelatedTransactionsDoNotDelayTheFeed(t *testing.T) {
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
			ctx := testCtx(t)
			pg := dbtest.NewPostgres(t)
			store := newGormStore(t, pg.DB)
			require.NoError(t, pg.DB.Exec("CREATE TABLE other (id int PRIMARY KEY, v text)").Error)
			require.NoError(t, pg.DB.Exec("INSERT INTO other (id, v) VALUES (1, 'old')").Error)
			require.NoError(t, store.Append(ctx, "before", 0, newEvent("before", "x", nil)))

			blocker := pgConnect(t, pg.DSN)
			_, err := blocker.Exec(ctx, "BEGIN")
			require.NoError(t, err)
			for _, stmt := range c.stmt {
				_, err := blocker.Exec(ctx, stmt)
				require.NoError(t, err)
			}
			var blockerPID int
			require.NoError(t, blocker.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&blockerPID))

			ev := newEvent("during", "y", map[string]any{"n": 1})
			var feed []domain.EventEnvelope[any]
			var head int64
			done := goAsync(func() error {
				if err := store.Append(ctx, "during", 0, ev); err != nil {
					return err
				}
				var err error
				if feed, err = store.ReadAfter(ctx, 0, 0); err != nil {
					return err
				}
				head, err = store.HeadPosition(ctx)
				return err
			})
			// The operations must finish while the blocker is still open:
			// it is only released below.
			require.NoError(t, result(t, done, "append and read with an unrelated transaction open"))
			require.Equal(t, []string{ids(feed)[0], ev.ID}, ids(feed))
			require.Equal(t, feed[1].Position, head)

			var state string
			require.NoError(t, pg.DB.Raw("SELECT state FROM pg_stat_activity WHERE pid = ?", blockerPID).Scan(&state).Error)
			require.Equal(t, "idle in transaction", state, "the unrelated transaction was open throughout")
			_, err = blocker.Exec(ctx, "COMMIT")
			require.NoError(t, err)
		})
	}
}

// TestPostgresSchemasDoNotBlockEachOther holds an append open in one
// schema: appends and reads in another schema proceed.
func TestPostgresSchemasDoNotBlockEachOther(t *testing.T) {
	ctx := testCtx(t)
	pgA, pgB := dbtest.NewPostgres(t), dbtest.NewPostgres(t)
	storeA, storeB := newGormStore(t, pgA.DB), newGormStore(t, pgB.DB)
	observer := pgConnect(t, pgA.DSN)
	require.NotEqual(t, appendLockKey(t, observer), appendLockKey(t, pgConnect(t, pgB.DSN)))

	gate := newAppendGate(t, pgA)
	held := newEvent("held-a", "x", nil)
	doneA := goAsync(func() error { return storeA.Append(context.Background(), "held-a", 0, held) })
	gate.waitHeld(t, 1)

	for i := range 3 {
		require.NoError(t, storeB.Append(ctx, "b", i, newEvent("b", "y", i)))
	}
	feedB, err := storeB.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2, 3}, positions(feedB))
	feedA, err := storeA.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	require.Empty(t, feedA)
	require.False(t, finished(doneA), "schema A's append was held throughout")

	gate.release()
	require.NoError(t, result(t, doneA, "held append in schema A"))
	feedA, err = storeA.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	require.Equal(t, []string{held.ID}, ids(feedA))
}

// TestPostgresConstructionWhileAppending constructs stores concurrently,
// on separate pools as separate processes would, while others append.
func TestPostgresConstructionWhileAppending(t *testing.T) {
	t.Run("concurrent first construction on an empty schema", func(t *testing.T) {
		ctx := testCtx(t)
		pg := dbtest.NewPostgres(t)
		const procs = 4
		pools := make([]*gorm.DB, procs)
		for i := range pools {
			pools[i] = pg.Open(t)
		}
		start := make(chan struct{})
		errs := make(chan error, procs)
		var wg sync.WaitGroup
		for i, p := range pools {
			wg.Go(func() {
				<-start
				agg := fmt.Sprintf("proc%d", i)
				for round := range 3 {
					s, err := infrastructure.NewGormEventStore(p)
					if err == nil {
						err = s.Append(ctx, agg, round, newEvent(agg, "x", round))
					}
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		feed, err := newGormStore(t, pg.DB).ReadAfter(ctx, 0, 0)
		require.NoError(t, err)
		require.Len(t, feed, procs*3)
		requireStrictlyIncreasing(t, feed)
	})

	t.Run("construction while writers append", func(t *testing.T) {
		ctx := testCtx(t)
		pg := dbtest.NewPostgres(t)
		store := newGormStore(t, pg.DB)
		const constructors = 3
		pools := make([]*gorm.DB, constructors)
		for i := range pools {
			pools[i] = pg.Open(t)
		}
		var (
			constructing atomic.Int32
			appends      atomic.Int32
			wg           sync.WaitGroup
			errs         = make(chan error, 16)
		)
		constructing.Store(constructors)
		for w := range 3 {
			wg.Go(func() {
				agg := fmt.Sprintf("writer%d", w)
				// Keep appending until every constructor is done, and at
				// least a few times.
				for i := 0; i < 5 || constructing.Load() > 0; i++ {
					if err := store.Append(ctx, agg, 2*i, newEvent(agg, "x", i), newEvent(agg, "x", i)); err != nil {
						errs <- err
						return
					}
					appends.Add(1)
				}
			})
		}
		for _, p := range pools {
			wg.Go(func() {
				defer constructing.Add(-1)
				for range 5 {
					s, err := infrastructure.NewGormEventStore(p)
					if err == nil {
						_, err = s.HeadPosition(ctx)
					}
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		feed, err := store.ReadAfter(ctx, 0, 0)
		require.NoError(t, err)
		require.Len(t, feed, 2*int(appends.Load()))
		requireStrictlyIncreasing(t, feed)
	})
}

// TestPostgresAppendUnderStricterDefaultIsolation runs concurrent appends
// on pools whose sessions default to a stricter isolation level: the
// append transaction must still see every earlier append once it holds the
// lock, and never fail with a serialization error.
func TestPostgresAppendUnderStricterDefaultIsolation(t *testing.T) {
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			ctx := testCtx(t)
			pg := dbtest.NewPostgres(t)
			u, err := url.Parse(pg.DSN)
			require.NoError(t, err)
			u.RawQuery += "&default_transaction_isolation=" + url.PathEscape(level)
			s := newGormStore(t, dbtest.OpenPostgresDSN(t, u.String()))
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			for w := range 4 {
				wg.Go(func() {
					agg := fmt.Sprintf("iso%d", w)
					for i := range 8 {
						if err := s.Append(ctx, agg, i, newEvent(agg, "x", i)); err != nil {
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			feed, err := s.ReadAfter(ctx, 0, 0)
			require.NoError(t, err)
			require.Equal(t, int64(32), feed[len(feed)-1].Position)
			require.True(t, slices.IsSorted(positions(feed)))
		})
	}
}

// TestPostgresTransactionOrderIgnoresCollation gives the aggregate_id
// column a linguistic collation, under which "B" sorts after "a":
// GetEventsByTransactionID still orders aggregate IDs by their bytes, as
// MemoryStore and SQLite do.
func TestPostgresTransactionOrderIgnoresCollation(t *testing.T) {
	ctx := testCtx(t)
	pg := dbtest.NewPostgres(t)
	s := newGormStore(t, pg.DB)
	var icu bool
	require.NoError(t, pg.DB.Raw("SELECT EXISTS (SELECT 1 FROM pg_collation WHERE collname = 'und-x-icu')").Scan(&icu).Error)
	if !icu {
		t.Skip("the server has no ICU collation")
	}
	require.NoError(t, pg.DB.Exec(`ALTER TABLE events ALTER COLUMN aggregate_id TYPE text COLLATE "und-x-icu"`).Error)
	for _, agg := range []string{"a", "B", "b", "A"} {
		e := newEvent(agg, "x", nil)
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

// TestPostgresQueuedAppendHonoursCancellation cancels an append while it
// waits for the append lock: it returns the context's error at once,
// stores nothing, and the feed carries on.
func TestPostgresQueuedAppendHonoursCancellation(t *testing.T) {
	ctx := testCtx(t)
	pg := dbtest.NewPostgres(t)
	store := newGormStore(t, pg.DB)
	gate := newAppendGate(t, pg)
	observer := pgConnect(t, pg.DSN)

	held := newEvent("held", "x", nil)
	doneHeld := goAsync(func() error { return store.Append(context.Background(), "held", 0, held) })
	gate.waitHeld(t, 1)

	queuedCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	queued := newEvent("queued", "x", nil)
	doneQueued := goAsync(func() error { return store.Append(queuedCtx, "queued", 0, queued) })
	waitForLockWaiters(t, observer, appendLockKey(t, observer), 1, "the queued append")
	cancel()
	require.ErrorIs(t, result(t, doneQueued, "canceled append"), context.Canceled)
	require.False(t, finished(doneHeld), "the held append is still open")

	gate.release()
	require.NoError(t, result(t, doneHeld, "held append"))
	// The cancellation reaches the server asynchronously: on a loaded
	// machine the queued statement can still take the lock and commit once
	// the gate opens. Its caller was told so (a canceled Append's outcome is
	// unknown), and retrying the identical append is safe either way.
	if err := store.Append(ctx, "queued", 0, queued); err != nil {
		require.ErrorIs(t, err, domain.ErrAlreadyAppended, "the canceled append can be retried")
	}
	feed, err := store.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	require.Equal(t, []string{held.ID, queued.ID}, ids(feed), "each append stored exactly once, in order")
}
