package subscriptions_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// faultCommitCase is one way an event can make its batch's COMMIT fail
// although its handler returned nil.
type faultCommitCase struct {
	name string
	// postgresOnly: the fault exists only there (SQLite has no idle
	// timeout, and a failed statement does not abort its transaction).
	postgresOnly bool
	// sqliteOnly: the fault exists only there (a statement that rolls
	// back the whole transaction).
	sqliteOnly bool
	// swallowed: the culprit's handler swallows the failed statement
	// (see TestFaultSwallowedFailureParksTheCulprit).
	swallowed bool
	// env returns the backend the subscriber runs on (default: e).
	env func(t *testing.T, e *env) *env
	// setup creates what the handler writes to, in e.DB.
	setup func(t *testing.T, e *env, table string)
	// handle is the handler's work for one event on e; bad is the culprit.
	handle func(ctx context.Context, e *env, table string, ev domain.EventEnvelope[any], bad bool) error
	// parkedError is part of the parked entry's error (pgxParkedError on
	// the pgx backend, when set).
	parkedError, pgxParkedError string
	// after, when set, checks the handler's other tables at the end.
	after func(t *testing.T, e *env, table string)
}

// faultCommitCases are the commit-time failures of issue 12: a deferred
// foreign key, a transaction kept open past
// idle_in_transaction_session_timeout, a failed statement the handler
// swallowed, and a handler that commits or rolls back the batch
// transaction itself.
func faultCommitCases() []faultCommitCase {
	plain := func(t *testing.T, e *env, table string) { createProjection(t, e.DB, table) }
	projectOnly := func(ctx context.Context, e *env, table string, ev domain.EventEnvelope[any]) error {
		return e.project(ctx, table, ev)
	}
	// rollbackGuard is the SQLite cases' setup: a table whose trigger
	// rolls back the whole transaction on the row v = 'bad', and a table
	// the culprit's handler writes to after it; noWriteAfterRollback
	// checks that none of those writes committed in autocommit.
	rollbackGuard := func(t *testing.T, e *env, table string) {
		createProjection(t, e.DB, table)
		require.NoError(t, e.DB.Exec("CREATE TABLE "+table+"_guard (id integer PRIMARY KEY, v text)").Error)
		require.NoError(t, e.DB.Exec("CREATE TABLE "+table+"_after (id text)").Error)
		require.NoError(t, e.DB.Exec("CREATE TRIGGER "+table+"_refuse BEFORE INSERT ON "+table+
			"_guard WHEN NEW.v = 'bad' BEGIN SELECT RAISE(ROLLBACK, 'the guard refused the row'); END").Error)
	}
	noWriteAfterRollback := func(t *testing.T, e *env, table string) {
		var n int64
		require.NoError(t, e.DB.Raw("SELECT count(*) FROM "+table+"_after").Scan(&n).Error)
		require.Zero(t, n, "a write after the rollback ran in autocommit")
	}
	endTx := func(op string) faultCommitCase {
		return faultCommitCase{
			name:  "handler calls " + op + " on the batch transaction",
			setup: plain,
			handle: func(ctx context.Context, e *env, table string, ev domain.EventEnvelope[any], bad bool) error {
				if err := projectOnly(ctx, e, table, ev); err != nil || !bad {
					return err
				}
				if e.Pgx != nil {
					tx := pgxstore.TxFromContext(ctx)
					var err error
					if op == "Commit" {
						err = tx.Commit(ctx)
					} else {
						err = tx.Rollback(ctx)
					}
					if !errors.Is(err, pgxstore.ErrTxOwnedByBatch) {
						return fmt.Errorf("%s on the batch transaction returned %v, want pgxstore.ErrTxOwnedByBatch", op, err)
					}
					return nil // swallowed: the batch must still refuse to commit
				}
				tx := subscriptions.TxFromContext(ctx)
				var err error
				if op == "Commit" {
					err = tx.Commit().Error
				} else {
					err = tx.Rollback().Error
				}
				if !errors.Is(err, sql.ErrTxDone) {
					return fmt.Errorf("%s on the batch transaction returned %v, want sql.ErrTxDone", op, err)
				}
				return nil // swallowed: the batch must still refuse to commit
			},
			parkedError:    "a handler called " + op + " on the batch transaction",
			pgxParkedError: op + " by a handler: " + pgxstore.ErrTxOwnedByBatch.Error(),
		}
	}
	return []faultCommitCase{
		{
			name: "deferred foreign key",
			setup: func(t *testing.T, e *env, table string) {
				if e.DB.Name() == "sqlite" {
					// The file DSN enables foreign keys; the one-connection
					// in-memory database is switched here.
					require.NoError(t, e.DB.Exec("PRAGMA foreign_keys = ON").Error)
				}
				require.NoError(t, e.DB.Exec("CREATE TABLE "+table+"_parent (id text PRIMARY KEY)").Error)
				require.NoError(t, e.DB.Exec("INSERT INTO "+table+"_parent (id) VALUES ('p')").Error)
				require.NoError(t, e.DB.Exec("CREATE TABLE "+table+` (event_id text PRIMARY KEY, position bigint NOT NULL,
					parent text NOT NULL REFERENCES `+table+`_parent (id) DEFERRABLE INITIALLY DEFERRED)`).Error)
			},
			handle: func(ctx context.Context, e *env, table string, ev domain.EventEnvelope[any], bad bool) error {
				parent := "p"
				if bad {
					parent = "missing"
				}
				return e.Exec(ctx, "INSERT INTO "+table+" (event_id, position, parent) VALUES (?, ?, ?)",
					ev.ID, ev.Position, parent)
			},
			parkedError: "foreign key",
		},
		{
			name:         "transaction idle past idle_in_transaction_session_timeout",
			postgresOnly: true,
			env: func(t *testing.T, e *env) *env {
				dsn := faultDSN(t, e.PG.DSN, "idle_in_transaction_session_timeout", "500")
				if e.Pgx != nil {
					return pgxEnvOn(t, e.PG, dbtest.OpenPgxDSN(t, dsn))
				}
				db := dbtest.OpenPostgresDSN(t, dsn)
				return gormEnv(t, "postgres", db, e.PG)
			},
			setup: plain,
			handle: func(ctx context.Context, e *env, table string, ev domain.EventEnvelope[any], bad bool) error {
				if err := projectOnly(ctx, e, table, ev); err != nil || !bad {
					return err
				}
				// A slow handler: the transaction is idle meanwhile, and the
				// server ends the session (its own timer, at 500 ms).
				time.Sleep(1000 * time.Millisecond)
				return nil
			},
			parkedError: "idle-in-transaction",
		},
		{
			// A trigger's RAISE(ROLLBACK) ends the whole SQLite
			// transaction; the handler swallows it and writes on. None of
			// its later writes, of the handlers after it or of the
			// checkpoint may run in autocommit.
			name:       "handler swallows a statement that rolled back the whole SQLite transaction",
			sqliteOnly: true,
			swallowed:  true,
			setup:      rollbackGuard,
			handle: func(ctx context.Context, e *env, table string, ev domain.EventEnvelope[any], bad bool) error {
				if err := projectOnly(ctx, e, table, ev); err != nil || !bad {
					return err
				}
				_ = e.Exec(ctx, "INSERT INTO "+table+"_guard (v) VALUES ('bad')")
				_ = e.Exec(ctx, "INSERT INTO "+table+"_after (id) VALUES (?)", ev.ID)
				return nil
			},
			parkedError: "rolled back the whole SQLite transaction",
			after:       noWriteAfterRollback,
		},
		{
			// The same, the failing statement run as a query
			// (INSERT ... RETURNING through Row().Scan): its error surfaces
			// past the batch's view of the transaction, yet none of the
			// handler's later writes may run in autocommit either.
			name:       "handler swallows a query that rolled back the whole SQLite transaction",
			sqliteOnly: true,
			swallowed:  true,
			setup:      rollbackGuard,
			handle: func(ctx context.Context, e *env, table string, ev domain.EventEnvelope[any], bad bool) error {
				if err := projectOnly(ctx, e, table, ev); err != nil || !bad {
					return err
				}
				var id int64
				_ = e.QueryRow(ctx, "INSERT INTO "+table+"_guard (v) VALUES ('bad') RETURNING id").Scan(&id)
				for i := 0; i < 3; i++ {
					_ = e.Exec(ctx, "INSERT INTO "+table+"_after (id) VALUES (?)", fmt.Sprintf("%s-%d", ev.ID, i))
				}
				return nil
			},
			parkedError: "rolled back the whole SQLite transaction",
			after:       noWriteAfterRollback,
		},
		{
			name:         "handler swallows a failed statement",
			postgresOnly: true,
			swallowed:    true,
			setup:        plain,
			handle: func(ctx context.Context, e *env, table string, ev domain.EventEnvelope[any], bad bool) error {
				if err := projectOnly(ctx, e, table, ev); err != nil || !bad {
					return err
				}
				_ = e.Exec(ctx, "SELECT * FROM fault_commit_no_such_table")
				return nil
			},
			parkedError: "aborted",
		},
		endTx("Commit"),
		endTx("Rollback"),
	}
}

// TestFaultCommitFailureIsParked: an event whose handler returns nil but
// whose transaction cannot commit takes the handler-failure path. The five
// events before it commit (each handled at most three times: in the
// failed batch, in the batch of the events before a handler that failed
// because of the culprit, and alone), it is retried and parked with the commit's error,
// the events behind it are processed, and the checkpoint reaches the head.
// Without a parking lot the events before it commit and the checkpoint
// halts just before it.
func TestFaultCommitFailureIsParked(t *testing.T) {
	t.Parallel()
	for _, b := range dbEnvs() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel() // every case opens a backend of its own
			for i, tc := range faultCommitCases() {
				t.Run(tc.name, func(t *testing.T) {
					faultCommitSkip(t, tc, b.Postgres) // before opening a database for nothing
					t.Parallel()                       // each case has its own backend
					base := b.New(t)
					e := base
					if tc.env != nil {
						e = tc.env(t, base)
					}
					for _, lot := range []bool{true, false} {
						table := fmt.Sprintf("fault_commit_%d_%t", i, lot)
						tc.setup(t, e, table)
						name := "fault-commit-" + table
						faultCommitRun(t, e, tc, table, name, lot, false)
					}
				})
			}
		})
	}
}

func faultCommitSkip(t *testing.T, tc faultCommitCase, postgres bool) {
	if tc.postgresOnly && !postgres {
		t.Skip("a Postgres fault")
	}
	if tc.sqliteOnly && postgres {
		t.Skip("a SQLite fault")
	}
}

// faultCommitRun runs the case on e: with a parking lot or without, with
// tc.handle as the Handler or called for each event by a BatchHandler.
func faultCommitRun(t *testing.T, e *env, tc faultCommitCase, table, name string, withLot, batch bool) {
	ctx := context.Background()
	headBefore, err := e.Events.HeadPosition(ctx)
	require.NoError(t, err)
	require.NoError(t, e.Checkpoints.Reset(ctx, name, headBefore))
	before := appendN(t, e.Events, "fault.commit", 0, 5)
	badID := appendN(t, e.Events, "fault.commit.bad", 5, 1)[0]
	after := appendN(t, e.Events, "fault.commit", 6, 3)
	bad, err := e.Events.GetEventByID(ctx, badID)
	require.NoError(t, err)

	var mu sync.Mutex
	calls := map[string]int{}
	handler := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		mu.Lock()
		calls[ev.ID]++
		mu.Unlock()
		return tc.handle(ctx, e, table, ev, ev.ID == badID)
	}
	opts := []subscriptions.SubscriberOption{
		subscriptions.WithLogger(quietLogger()), subscriptions.WithPollInterval(10 * time.Millisecond),
		subscriptions.WithRetryBackoff(time.Millisecond, 4*time.Millisecond),
	}
	if withLot {
		opts = append(opts, subscriptions.WithParkingLot(e.Parking), subscriptions.WithMaxRetries(1))
	}
	if batch {
		each := handler
		opts = append(opts, subscriptions.WithBatchHandler(func(ctx context.Context, evs []domain.EventEnvelope[any]) error {
			for _, ev := range evs {
				if err := each(ctx, ev); err != nil {
					return err
				}
			}
			return nil
		}))
		handler = nil
	}
	sub, err := subscriptions.NewSubscriber(name, e.Events, e.Checkpoints, handler, opts...)
	require.NoError(t, err)
	r := start(t, sub)
	callsOf := func(id string) int {
		mu.Lock()
		defer mu.Unlock()
		return calls[id]
	}

	if !withLot {
		// The events before the culprit commit; it halts the checkpoint.
		require.Eventually(t, func() bool {
			pos, err := e.Checkpoints.Position(ctx, name)
			return err == nil && pos == bad.Position-1 && callsOf(badID) >= 2
		}, 30*time.Second, 5*time.Millisecond, "the events before the culprit did not commit")
		r.stop(t)
		pos, err := e.Checkpoints.Position(ctx, name)
		require.NoError(t, err)
		require.Equal(t, bad.Position-1, pos)
		require.Subset(t, projected(t, e.DB, table), before)
		require.NotContains(t, projected(t, e.DB, table), badID)
		if tc.after != nil {
			tc.after(t, e, table)
		}
		return
	}

	parked := parkWaitParked(t, sub, 1)
	waitCaughtUp(t, sub)
	r.stop(t)
	require.Equal(t, badID, parked[0].EventID)
	require.Equal(t, bad.Position, parked[0].Position)
	require.Equal(t, 2, parked[0].Attempts, "the first attempt and one retry")
	wantError := tc.parkedError
	if e.Pgx != nil && tc.pgxParkedError != "" {
		wantError = tc.pgxParkedError
	}
	require.Contains(t, strings.ToLower(parked[0].Error), strings.ToLower(wantError))
	faultRequireExactlyOnce(t, "projected", projected(t, e.DB, table), append(append([]string{}, before...), after...))
	if tc.after != nil {
		tc.after(t, e, table)
	}
	// The failed batch, at most one prefix batch (when the culprit made
	// the handlers after it fail), then alone.
	for _, id := range before {
		require.LessOrEqual(t, callsOf(id), 3, "event %s before the culprit was re-run more than twice", id)
	}
}

// TestFaultWholeTransactionRollbackWithBatchHandler: a statement that
// rolled back the whole SQLite transaction, run as a statement or as a
// query, in a BatchHandler that swallows its error: none of the handler's
// later writes commits in autocommit, the events before the culprit
// commit once, the culprit is parked (or halts the checkpoint) as with a
// Handler. Both SQLite drivers.
func TestFaultWholeTransactionRollbackWithBatchHandler(t *testing.T) {
	t.Parallel()
	for _, b := range gormEnvs() {
		t.Run(b.Name, func(t *testing.T) {
			for i, tc := range faultCommitCases() {
				if !tc.sqliteOnly {
					continue
				}
				t.Run(tc.name, func(t *testing.T) {
					faultCommitSkip(t, tc, b.Postgres)
					t.Parallel()
					e := b.New(t)
					for _, lot := range []bool{true, false} {
						table := fmt.Sprintf("fault_batch_%d_%t", i, lot)
						tc.setup(t, e, table)
						faultCommitRun(t, e, tc, table, "fault-batch-"+table, lot, true)
					}
				})
			}
		})
	}
}

// TestFaultSwallowedFailureParksTheCulprit: the culprit, whose handler
// swallows a failed statement, is the first event of its batch, and the
// handler after it fails because of it (Postgres: "current transaction is
// aborted"; SQLite: the transaction is gone). With WithMaxRetries(0) the
// culprit alone is parked, never the event after it, and every other
// event is handled exactly once.
func TestFaultSwallowedFailureParksTheCulprit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range dbEnvs() {
		t.Run(b.Name, func(t *testing.T) {
			for i, tc := range faultCommitCases() {
				if !tc.swallowed {
					continue
				}
				t.Run(tc.name, func(t *testing.T) {
					faultCommitSkip(t, tc, b.Postgres)
					e := b.New(t)
					table := fmt.Sprintf("fault_culprit_%d", i)
					tc.setup(t, e, table)
					name := "fault-culprit-" + table
					head, err := e.Events.HeadPosition(ctx)
					require.NoError(t, err)
					require.NoError(t, e.Checkpoints.Reset(ctx, name, head))
					badID := appendN(t, e.Events, "fault.culprit.bad", 0, 1)[0]
					good := appendN(t, e.Events, "fault.culprit", 1, 4)
					handler := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
						return tc.handle(ctx, e, table, ev, ev.ID == badID)
					}
					sub, err := subscriptions.NewSubscriber(name, e.Events, e.Checkpoints, handler,
						subscriptions.WithLogger(quietLogger()), subscriptions.WithPollInterval(10*time.Millisecond),
						subscriptions.WithParkingLot(e.Parking), subscriptions.WithMaxRetries(0))
					require.NoError(t, err)
					r := start(t, sub)
					parkWaitParked(t, sub, 1)
					waitCaughtUp(t, sub)
					r.stop(t)
					parked, err := sub.ListParked(ctx)
					require.NoError(t, err)
					require.Len(t, parked, 1)
					require.Equal(t, badID, parked[0].EventID)
					faultRequireExactlyOnce(t, "projected", projected(t, e.DB, table), good)
					if tc.after != nil {
						tc.after(t, e, table)
					}
				})
			}
		})
	}
}

// faultFlakyCommits wraps a checkpoint store: the first `fail` commits of
// a batch that includes position `at` fail as a lost connection would
// (the real batch is rolled back).
type faultFlakyCommits struct {
	subscriptions.CheckpointStore
	at     int64
	mu     sync.Mutex
	fail   int
	failed int // commits failed so far
}

// setFail sets how many more commits fail and returns how many failed.
func (f *faultFlakyCommits) setFail(n int) (failed int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = n
	return f.failed
}

func (f *faultFlakyCommits) Acquire(ctx context.Context, name string) (subscriptions.Batch, bool, error) {
	b, ok, err := f.CheckpointStore.Acquire(ctx, name)
	if b != nil {
		b = &faultFlakyBatch{Batch: b, store: f}
	}
	return b, ok, err
}

type faultFlakyBatch struct {
	subscriptions.Batch
	store *faultFlakyCommits
}

func (b *faultFlakyBatch) Commit(ctx context.Context, position int64) error {
	f := b.store
	f.mu.Lock()
	inject := b.Position() < f.at && position >= f.at && f.fail > 0
	if inject {
		f.fail--
		f.failed++
	}
	f.mu.Unlock()
	if inject {
		_ = b.Batch.Rollback()
		return fmt.Errorf("injected: connection lost at commit: %w", driver.ErrBadConn)
	}
	return b.Batch.Commit(ctx, position)
}

// TestFaultTransientCommitFailureParksNothing: commit failures that say
// nothing about the events (a lost connection) are retried as they are,
// batch and all, after the poll interval; no event is blamed, retried
// alone or parked, even with WithMaxRetries(0). On Postgres the connection
// is really terminated (from inside the handler, twice); on every backend
// a commit also fails with driver.ErrBadConn twice.
func TestFaultTransientCommitFailureParksNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			for _, real := range []bool{false, true} {
				name := fmt.Sprintf("fault-transient-%t", real)
				t.Run(name, func(t *testing.T) {
					e := b.New(t)
					if real && !e.Postgres() {
						t.Skip("terminating a session is a Postgres fault")
					}
					var admin *gorm.DB
					if real {
						admin = e.PG.Open(t)
					}
					if e.DB != nil {
						createProjection(t, e.DB, "fault_transient")
					}
					ids := appendN(t, e.Events, "fault.transient", 0, 9)
					// The last event of the batch: a terminated session fails
					// its commit, not the handler of an event after it.
					culprit, err := e.Events.GetEventByID(ctx, ids[8])
					require.NoError(t, err)
					cps := e.Checkpoints
					if !real {
						cps = &faultFlakyCommits{CheckpointStore: e.Checkpoints, at: culprit.Position, fail: 2}
					}
					var mu sync.Mutex
					calls := map[string]int{}
					handler := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
						mu.Lock()
						calls[ev.ID]++
						n := calls[ev.ID]
						mu.Unlock()
						if e.DB != nil {
							if err := e.project(ctx, "fault_transient", ev); err != nil {
								return err
							}
						}
						if real && ev.ID == culprit.ID && n <= 2 {
							var pid int
							if err := e.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
								return err
							}
							if err := admin.Exec("SELECT pg_terminate_backend(?)", pid).Error; err != nil {
								return err
							}
						}
						return nil
					}
					sub, err := subscriptions.NewSubscriber(name, e.Events, cps, handler,
						subscriptions.WithLogger(quietLogger()), subscriptions.WithPollInterval(10*time.Millisecond),
						subscriptions.WithParkingLot(e.Parking), subscriptions.WithMaxRetries(0))
					require.NoError(t, err)
					r := start(t, sub)
					waitCaughtUp(t, sub)
					r.stop(t)

					parked, err := sub.ListParked(ctx)
					require.NoError(t, err)
					require.Empty(t, parked, "a lost connection parked an event")
					if e.DB != nil {
						faultRequireExactlyOnce(t, "projected", projected(t, e.DB, "fault_transient"), ids)
					}
					mu.Lock()
					defer mu.Unlock()
					require.Equal(t, 3, calls[culprit.ID], "two failed commits, then success")
					require.Equal(t, 3, calls[ids[0]], "the whole batch is retried, not one event at a time")
				})
			}
		})
	}
}

// TestFaultLibraryStatementFailureParksNothing: a failure of the
// library's own statement in a batch (here the removal of delivered parked
// entries, refused by a trigger: Postgres with SQLSTATE 42501, SQLite with
// a message that happens to contain "constraint failed") says nothing
// about the events: the batch is retried whole, no event is blamed or
// parked (even with WithMaxRetries(0)), and once the fault is gone every
// event is handled and the old entry is cleared.
func TestFaultLibraryStatementFailureParksNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range dbEnvs() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			createProjection(t, e.DB, "fault_library")
			const name = "fault-library"
			ids := appendN(t, e.Events, "fault.library", 0, 5)
			old, err := e.Events.GetEventByID(ctx, ids[2])
			require.NoError(t, err)
			// An entry left from before a reset: the batch's clear matches it.
			require.NoError(t, e.Parking.Park(ctx, subscriptions.ParkedEvent{Subscriber: name, EventID: old.ID,
				EventType: old.EventType, Position: old.Position, Error: "old", Attempts: 1, ParkedAt: time.Now().UTC()}))
			if e.Postgres() {
				require.NoError(t, e.DB.Exec(`CREATE FUNCTION fault_refuse_clear() RETURNS trigger LANGUAGE plpgsql AS $$
					BEGIN RAISE EXCEPTION 'permission denied to clear' USING ERRCODE = '42501'; END $$`).Error)
				require.NoError(t, e.DB.Exec("CREATE TRIGGER fault_refuse_clear BEFORE DELETE ON parked_events FOR EACH ROW EXECUTE FUNCTION fault_refuse_clear()").Error)
			} else {
				require.NoError(t, e.DB.Exec("CREATE TRIGGER fault_refuse_clear BEFORE DELETE ON parked_events BEGIN SELECT RAISE(ABORT, 'refused: constraint failed'); END").Error)
			}
			var mu sync.Mutex
			calls := map[string]int{}
			handler := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
				mu.Lock()
				calls[ev.ID]++
				mu.Unlock()
				return e.project(ctx, "fault_library", ev)
			}
			sub, err := subscriptions.NewSubscriber(name, e.Events, e.Checkpoints, handler,
				subscriptions.WithLogger(quietLogger()), subscriptions.WithPollInterval(10*time.Millisecond),
				subscriptions.WithParkingLot(e.Parking), subscriptions.WithMaxRetries(0))
			require.NoError(t, err)
			r := start(t, sub)
			require.Eventually(t, func() bool {
				mu.Lock()
				defer mu.Unlock()
				return calls[ids[0]] >= 3
			}, 30*time.Second, 5*time.Millisecond, "the batch was not retried")
			require.NoError(t, e.DB.Exec("DROP TRIGGER fault_refuse_clear"+map[bool]string{true: " ON parked_events", false: ""}[e.Postgres()]).Error)
			waitCaughtUp(t, sub)
			r.stop(t)
			parked, err := sub.ListParked(ctx)
			require.NoError(t, err)
			require.Empty(t, parked, "a failure of the library's statement parked an event, or the old entry stayed")
			faultRequireExactlyOnce(t, "projected", projected(t, e.DB, "fault_library"), ids)
		})
	}
}

// TestFaultCommitFailureKeepsParkedEntryOfLotOutsideTx: a MemoryParkingLot
// cannot join the batch transaction, so it removes a delivered event's
// entry only after the batch committed: while the commit fails (a lost
// connection, injected) the entry stays listed; once a commit succeeds it
// is gone.
func TestFaultCommitFailureKeepsParkedEntryOfLotOutsideTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			const name = "fault-lot-outside"
			ids := appendN(t, e.Events, "fault.lot", 0, 3)
			ev, err := e.Events.GetEventByID(ctx, ids[1])
			require.NoError(t, err)
			lot := subscriptions.NewMemoryParkingLot()
			// An entry left from before a reset: the batch delivers the event again.
			require.NoError(t, lot.Park(ctx, subscriptions.ParkedEvent{Subscriber: name, EventID: ev.ID,
				EventType: ev.EventType, Position: ev.Position, Error: "old", Attempts: 1, ParkedAt: time.Now().UTC()}))
			cps := &faultFlakyCommits{CheckpointStore: e.Checkpoints, at: ev.Position, fail: 1 << 30}
			sub, err := subscriptions.NewSubscriber(name, e.Events, cps,
				func(context.Context, domain.EventEnvelope[any]) error { return nil },
				subscriptions.WithLogger(quietLogger()), subscriptions.WithPollInterval(10*time.Millisecond),
				subscriptions.WithParkingLot(lot))
			require.NoError(t, err)
			r := start(t, sub)
			require.Eventually(t, func() bool {
				cps.mu.Lock()
				defer cps.mu.Unlock()
				return cps.failed >= 2
			}, 30*time.Second, 5*time.Millisecond, "no commit failed")
			parked, err := lot.List(ctx, name)
			require.NoError(t, err)
			require.Len(t, parked, 1, "a failed commit removed the entry of an event it did not handle")
			cps.setFail(0)
			waitCaughtUp(t, sub)
			r.stop(t)
			parked, err = lot.List(ctx, name)
			require.NoError(t, err)
			require.Empty(t, parked, "the delivered event's entry outlived its handling")
		})
	}
}
