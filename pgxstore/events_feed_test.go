package pgxstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/internal/feedtest"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// newGormEventStore returns a GormEventStore on pg's schema, on a pool of
// its own, as another process would have.
func newGormEventStore(t testing.TB, pg *dbtest.Postgres) *infrastructure.GormEventStore {
	t.Helper()
	s, err := infrastructure.NewGormEventStore(pg.Open(t))
	require.NoError(t, err)
	return s
}

// TestFeedNeverPassesAnUncommittedPosition forces the spec's interleaving
// with two connections: append A takes position 1 and stays open; append
// B comes next, through this store, through a GormEventStore on the same
// schema, or as a raw transaction that took its transaction id before A.
// While A is open no read returns B's position and B cannot commit; once
// A commits both appear, in order.
func TestFeedNeverPassesAnUncommittedPosition(t *testing.T) {
	cases := []struct {
		name           string
		bTakesXIDFirst bool
		startB         func(t *testing.T, pg *dbtest.Postgres, s *pgxstore.EventStore, conn *pgx.Conn) (string, chan error)
	}{
		{
			name: "second append through the store",
			startB: func(t *testing.T, _ *dbtest.Postgres, s *pgxstore.EventStore, _ *pgx.Conn) (string, chan error) {
				b := feedtest.NewEvent("b", "second", "B")
				return b.ID, feedAsync(func() error { return s.Append(context.Background(), "b", 0, b) })
			},
		},
		{
			name: "second append through a GormEventStore",
			startB: func(t *testing.T, pg *dbtest.Postgres, _ *pgxstore.EventStore, _ *pgx.Conn) (string, chan error) {
				g := newGormEventStore(t, pg)
				b := feedtest.NewEvent("b", "second", "B")
				return b.ID, feedAsync(func() error { return g.Append(context.Background(), "b", 0, b) })
			},
		},
		{
			// The spec's counterexample to the transaction-id guard.
			name:           "second transaction took its id before the first",
			bTakesXIDFirst: true,
			startB: func(t *testing.T, _ *dbtest.Postgres, _ *pgxstore.EventStore, conn *pgx.Conn) (string, chan error) {
				key := feedLockKey(t, conn)
				id := feedtest.UniqueID("raw-b")
				return id, feedAsync(func() error {
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
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := testCtx(t)
			store, pg := newEventStore(t)
			gate := newFeedGate(t, pg)
			observer := rawConn(t, pg.DSN)
			key := feedLockKey(t, observer)

			var bConn *pgx.Conn
			if c.bTakesXIDFirst {
				bConn = rawConn(t, pg.DSN)
				_, err := bConn.Exec(ctx, "BEGIN")
				require.NoError(t, err)
				var xid int64
				require.NoError(t, bConn.QueryRow(ctx, "SELECT txid_current()").Scan(&xid))
			}

			watcher := watchFeed(t, store)
			a := feedtest.NewEvent("held-a", "first", "A")
			doneA := feedAsync(func() error { return store.Append(context.Background(), "held-a", 0, a) })
			gate.waitHeld(t, 1)
			require.Equal(t, 1, feedLocks(t, observer, key, true), "the held append holds the append lock")

			idB, doneB := c.startB(t, pg, store, bConn)
			waitFeedLockWaiters(t, observer, key, 1, "the second append")

			for range 3 {
				feed, err := store.ReadAfter(ctx, 0, 0)
				require.NoError(t, err)
				require.Empty(t, feed)
				head, err := store.HeadPosition(ctx)
				require.NoError(t, err)
				require.Zero(t, head)
			}
			before := watcher.count()
			feedEventually(t, "the watcher reads while A is open", func() bool { return watcher.count() > before })
			require.False(t, feedFinished(doneA), "A is held at the gate")
			require.False(t, feedFinished(doneB), "B cannot commit while A is open")

			gate.release()
			require.NoError(t, feedResult(t, doneA, "append A"))
			require.NoError(t, feedResult(t, doneB, "append B"))

			feed, err := store.ReadAfter(ctx, 0, 0)
			require.NoError(t, err)
			require.Equal(t, []string{a.ID, idB}, feedtest.IDs(feed))
			require.Equal(t, []int64{1, 2}, feedtest.Positions(feed))

			feedEventually(t, "the watcher sees both events", func() bool { return len(watcher.last()) == 2 })
			for i, read := range watcher.finish(t) {
				require.Equal(t, []string{a.ID, idB}[:len(read)], read,
					"read #%d returned a position while a smaller one was not visible", i)
			}
		})
	}
}

// TestFeedFollowerReadsEveryEventOnce appends multi-event batches from
// many goroutines while a follower pages through the feed as a
// subscriber does: every event is read exactly once, in strictly
// increasing positions, none missing. In the mixed case half the writers
// append through a GormEventStore on the same schema, and the follower
// reads through each store in turn.
func TestFeedFollowerReadsEveryEventOnce(t *testing.T) {
	for _, mixed := range []bool{false, true} {
		t.Run(map[bool]string{false: "pgx", true: "pgx and gorm"}[mixed], func(t *testing.T) {
			const (
				writers          = 8
				appendsPerWriter = 12
				pageSize         = 50
			)
			ctx := testCtx(t)
			pgxStore, pg := newEventStore(t)
			stores := []domain.EventStore{pgxStore}
			if mixed {
				stores = append(stores, newGormEventStore(t, pg))
			}
			var (
				mu       sync.Mutex
				appended = map[string]domain.EventEnvelope[any]{}
				wg       sync.WaitGroup
				failures = make(chan error, writers)
				writing  atomic.Int32
			)
			writing.Store(writers)
			for w := range writers {
				s := stores[w%len(stores)]
				wg.Go(func() {
					defer writing.Add(-1)
					rng := rand.New(rand.NewPCG(uint64(w), 7))
					agg := feedtest.UniqueID(fmt.Sprintf("writer%d", w))
					for i := range appendsPerWriter {
						batch := make([]domain.EventEnvelope[any], 1+rng.IntN(10))
						for j := range batch {
							batch[j] = feedtest.NewEvent(agg, "batch.item", map[string]any{"w": w, "i": i, "j": j, "s": "ü\"\\"})
							batch[j].Metadata = map[string]any{"writer": float64(w)}
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
							appended[e.ID] = e
						}
						mu.Unlock()
					}
				})
			}

			var (
				last      int64
				delivered []domain.EventEnvelope[any]
				seen      = map[string]bool{}
			)
			for read := 0; ; read++ {
				doneWriting := writing.Load() == 0
				page, err := stores[read%len(stores)].ReadAfter(ctx, last, pageSize)
				require.NoError(t, err)
				require.LessOrEqual(t, len(page), pageSize)
				for _, e := range page {
					require.Greater(t, e.Position, last, "positions strictly increase along the feed")
					require.False(t, seen[e.ID], "event %s delivered twice", e.ID)
					seen[e.ID] = true
					last = e.Position
					delivered = append(delivered, e)
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
			require.Len(t, delivered, len(appended))
			for _, s := range stores {
				all, err := s.ReadAfter(ctx, 0, 0)
				require.NoError(t, err)
				require.Equal(t, feedtest.IDs(all), feedtest.IDs(delivered), "%T reads the whole feed, in order", s)
				require.Equal(t, delivered, all, "%T reads every event as the follower did", s)
				head, err := s.HeadPosition(ctx)
				require.NoError(t, err)
				require.Equal(t, last, head)
			}
			for _, e := range delivered {
				want, ok := appended[e.ID]
				require.True(t, ok, "event %s was delivered but not appended", e.ID)
				require.Equal(t, want.AggregateID, e.AggregateID)
				require.Equal(t, want.Metadata, e.Metadata)
				require.True(t, want.Created.Truncate(time.Microsecond).Equal(e.Created))
			}
		})
	}
}

// TestFeedNotDelayedByUnrelatedTransactions keeps a transaction open on
// another connection: appends and feed reads complete while it is open.
func TestFeedNotDelayedByUnrelatedTransactions(t *testing.T) {
	cases := []struct {
		name string
		stmt []string
	}{
		{"writes to another table", []string{"INSERT INTO other (id, v) VALUES (2, 'new')"}},
		{"locks a row of another table", []string{"SELECT v FROM other WHERE id = 1 FOR UPDATE"}},
		{"holds a transaction id", []string{"SELECT txid_current()"}},
		{"long repeatable-read snapshot of the events", []string{"SET TRANSACTION ISOLATION LEVEL REPEATABLE READ", "SELECT COUNT(*) FROM events"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := testCtx(t)
			store, pg := newEventStore(t)
			admin := rawConn(t, pg.DSN)
			_, err := admin.Exec(ctx, "CREATE TABLE other (id int PRIMARY KEY, v text)")
			require.NoError(t, err)
			_, err = admin.Exec(ctx, "INSERT INTO other (id, v) VALUES (1, 'old')")
			require.NoError(t, err)
			before := feedtest.NewEvent("before", "x", nil)
			require.NoError(t, store.Append(ctx, "before", 0, before))

			blocker := rawConn(t, pg.DSN)
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
			done := feedAsync(func() error {
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
			// They must finish while the blocker is open: it is released
			// only below.
			require.NoError(t, feedResult(t, done, "append and read with an unrelated transaction open"))
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

// TestQueuedAppendHonoursCancellation cancels an append while it waits
// for the append lock behind a held one: it returns the context's error,
// the feed carries on, and retrying it is safe.
func TestQueuedAppendHonoursCancellation(t *testing.T) {
	ctx := testCtx(t)
	store, pg := newEventStore(t)
	gate := newFeedGate(t, pg)
	observer := rawConn(t, pg.DSN)

	held := feedtest.NewEvent("held", "x", nil)
	doneHeld := feedAsync(func() error { return store.Append(context.Background(), "held", 0, held) })
	gate.waitHeld(t, 1)

	queuedCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	queued := feedtest.NewEvent("queued", "x", nil)
	doneQueued := feedAsync(func() error { return store.Append(queuedCtx, "queued", 0, queued) })
	waitFeedLockWaiters(t, observer, feedLockKey(t, observer), 1, "the queued append")
	cancel()
	require.ErrorIs(t, feedResult(t, doneQueued, "the cancelled append"), context.Canceled)
	require.False(t, feedFinished(doneHeld), "the held append is still open")

	gate.release()
	require.NoError(t, feedResult(t, doneHeld, "the held append"))
	// The cancellation reaches the server asynchronously, so the queued
	// statement may still have committed; the retry is safe either way.
	if err := store.Append(ctx, "queued", 0, queued); err != nil {
		require.ErrorIs(t, err, domain.ErrAlreadyAppended)
	}
	feed, err := store.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	require.Equal(t, []string{held.ID, queued.ID}, feedtest.IDs(feed), "each append stored once, in order")
}

// TestAppendUnderStricterDefaultIsolation appends concurrently through
// pools whose sessions default to a stricter isolation level: the append
// transaction is READ COMMITTED whatever the default, so it sees every
// earlier append once it holds the lock and never fails to serialize.
func TestAppendUnderStricterDefaultIsolation(t *testing.T) {
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			ctx := testCtx(t)
			pg, _ := newDatabase(t)
			cfg, err := pgxpool.ParseConfig(pg.DSN)
			require.NoError(t, err)
			cfg.MaxConns = 4
			cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = level
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			var got string
			require.NoError(t, pool.QueryRow(ctx, "SHOW default_transaction_isolation").Scan(&got))
			require.Equal(t, level, got)
			s, err := pgxstore.NewEventStore(ctx, pool)
			require.NoError(t, err)
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
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			feed, err := s.ReadAfter(ctx, 0, 0)
			require.NoError(t, err)
			require.Len(t, feed, 32)
			require.Equal(t, int64(32), feed[len(feed)-1].Position)
			feedtest.RequireStrictlyIncreasing(t, feed)
		})
	}
}
