package subscriptions_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// faultCancelSteps are the points of a batch cycle at which the Run
// context is cancelled: before and after each call Run makes into the
// event store, the checkpoint store, the batch, the handler and the
// parking lot.
var faultCancelSteps = []string{
	"position",          // CheckpointStore.Position, before the call
	"read",              // EventStore.ReadAfter, before the call (the read itself sees it)
	"read-done",         // after a read that returned events, before Acquire
	"acquire",           // CheckpointStore.Acquire, before the call
	"acquired",          // after a successful Acquire, before the handlers
	"handler",           // inside the handler, before it writes
	"handler-fail",      // inside the handler, as it returns an error
	"savepoint",         // Batch.Savepoint (the last attempt at a failing event)
	"rollback-to-point", // Batch.RollbackToSavepoint
	"park",              // ParkingLot.Park, before the call
	"commit",            // Batch.Commit, before the call
	"committed",         // after Batch.Commit returned
	"rollback",          // Batch.Rollback, before the call
}

// TestFaultCancelAtEveryStep cancels the context given to Run at every step
// of a batch cycle (faultCancelSteps), at its first, second, ... occurrence,
// on a feed with a transient and a permanent failure so that the retry and
// parking paths are among the steps. Each time Run returns nil, no
// transaction is left open (no connection of the pool in use; on Postgres
// no session of the test's application_name idle in transaction), and a
// restarted subscriber catches up with every event projected exactly once
// and the poison event parked exactly once.
func TestFaultCancelAtEveryStep(t *testing.T) {
	t.Parallel()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		pg := dbtest.NewPostgres(t)
		app := faultAppName()
		db := dbtest.OpenPostgresDSN(t, faultDSN(t, pg.DSN, "application_name", app))
		faultCancelSuite(t, gormEnv(t, "postgres", db, pg), func(t *testing.T) { faultRequireNoIdleInTx(t, pg.DB, app) })
	})
	t.Run("pgx", func(t *testing.T) {
		t.Parallel()
		pg := dbtest.NewPostgres(t)
		app := faultAppName()
		pool := dbtest.OpenPgxDSN(t, faultDSN(t, pg.DSN, "application_name", app))
		faultCancelSuite(t, pgxEnvOn(t, pg, pool), func(t *testing.T) { faultRequireNoIdleInTx(t, pg.DB, app) })
	})
	t.Run("sqlite-file", func(t *testing.T) {
		t.Parallel()
		db := dbtest.OpenSQLite(t, dbtest.SQLiteFileDSN(filepath.Join(t.TempDir(), "cancel.db")))
		faultCancelSuite(t, gormEnv(t, "sqlite-file", db, nil), nil)
	})
}

func faultCancelSuite(t *testing.T, e *env, noLeakedTx func(t *testing.T)) {
	db, store, cps, lot := e.DB, e.Events, e.Checkpoints, e.Parking

	ids := appendN(t, store, "fault.cancel", 0, 30)
	transient, poison := ids[4], ids[11]
	feed := faultFeedIDs(t, store)
	head := faultHead(t, store)
	var others []string
	for _, id := range feed {
		if id != poison {
			others = append(others, id)
		}
	}

	reached := map[string]bool{}
	nths := []int{1, 3}
	if faultLong() {
		nths = []int{1, 2, 3, 4, 5, 6, 7, 8}
	}
	cases := 0
	for _, step := range faultCancelSteps {
		for _, nth := range nths {
			cases++
			name := fmt.Sprintf("cancel-%s-%d", step, nth)
			table := "fault_cancel_" + strings.ReplaceAll(step, "-", "_") + fmt.Sprint(nth)
			createProjection(t, db, table)

			ctx, cancel := context.WithCancel(context.Background())
			point := &faultCancelPoint{step: step, nth: nth, cancel: cancel, counts: map[string]int{}}
			attempts := &sync.Map{}
			handler := faultCancelHandler(e, table, transient, poison, attempts, point)
			sub, err := subscriptions.NewSubscriber(name,
				&faultCancelEvents{EventStore: store, point: point},
				&faultCancelCheckpoints{CheckpointStore: cps, point: point},
				handler,
				subscriptions.WithParkingLot(&faultCancelLot{ParkingLot: lot, point: point}),
				subscriptions.WithMaxRetries(1), subscriptions.WithRetryBackoff(time.Millisecond, time.Millisecond),
				subscriptions.WithBatchSize(7), subscriptions.WithPollInterval(10*time.Millisecond),
				subscriptions.WithLogger(quietLogger()))
			require.NoError(t, err)
			done := make(chan error, 1)
			go func() { done <- sub.Run(ctx) }()

			// Run returns once the step cancels it; a step that never comes
			// this many times lets the subscriber catch up instead.
			returned := false
			var runErr error
			require.Eventually(t, func() bool {
				select {
				case runErr = <-done:
					returned = true
					return true
				default:
				}
				return !point.fired.Load() && faultCheckpoint(t, db, name) == head
			}, 30*time.Second, 2*time.Millisecond, "%s: Run neither returned nor caught up", name)
			if !returned {
				cancel()
				select {
				case runErr = <-done:
				case <-time.After(30 * time.Second):
					t.Fatalf("%s: Run did not return within 30s of the cancellation", name)
				}
			}
			cancel()
			require.NoError(t, runErr, "%s: Run", name)
			if point.fired.Load() {
				reached[step] = true
			}

			// Nothing left open.
			require.Eventually(t, func() bool { return e.inUse(t) == 0 }, 5*time.Second, 5*time.Millisecond,
				"%s: a connection is still in use after Run returned (a leaked transaction)", name)
			if noLeakedTx != nil {
				noLeakedTx(t)
			}

			// Restart: the subscriber catches up, nothing lost or doubled.
			plain, err := subscriptions.NewSubscriber(name, store, cps,
				faultCancelHandler(e, table, transient, poison, attempts, nil),
				subscriptions.WithParkingLot(lot),
				subscriptions.WithMaxRetries(1), subscriptions.WithRetryBackoff(time.Millisecond, time.Millisecond),
				subscriptions.WithBatchSize(7), subscriptions.WithPollInterval(10*time.Millisecond),
				subscriptions.WithLogger(quietLogger()))
			require.NoError(t, err)
			r := start(t, plain)
			faultWaitCheckpointAtHead(t, db, store, name, 30*time.Second)
			r.stop(t)

			got := projected(t, db, table)
			require.ElementsMatch(t, others, got, "%s: projection", name)
			parked, err := lot.List(context.Background(), name)
			require.NoError(t, err)
			require.Len(t, parked, 1, "%s: parked", name)
			require.Equal(t, poison, parked[0].EventID, "%s: parked", name)
			if noLeakedTx != nil {
				noLeakedTx(t)
			}
		}
	}
	var missed []string
	for _, step := range faultCancelSteps {
		if !reached[step] {
			missed = append(missed, step)
		}
	}
	require.Empty(t, missed, "steps the feed never reached: the cancellation was never tried there")
	t.Logf("cancel at every step on %s: %d cases (%d steps x occurrences %v), %d events each, none lost or doubled",
		e.Name, cases, len(faultCancelSteps), nths, len(feed))
}

// faultCancelHandler projects every event; transient fails its first
// attempt, poison fails always. With a point, it cancels at "handler" and
// "handler-fail".
func faultCancelHandler(e *env, table, transient, poison string, attempts *sync.Map, point *faultCancelPoint) subscriptions.Handler {
	return func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		point.hit("handler")
		if err := e.project(ctx, table, ev); err != nil {
			return err
		}
		counter, _ := attempts.LoadOrStore(ev.ID, new(atomic.Int32))
		attempt := counter.(*atomic.Int32).Add(1)
		if ev.ID == poison || (ev.ID == transient && attempt == 1) {
			point.hit("handler-fail")
			return errors.New("injected failure")
		}
		return nil
	}
}

// faultCancelPoint cancels the Run context at the nth hit of one step.
type faultCancelPoint struct {
	step   string
	nth    int
	cancel context.CancelFunc
	fired  atomic.Bool

	mu     sync.Mutex
	counts map[string]int
}

// hit records that step is reached; a nil point does nothing.
func (p *faultCancelPoint) hit(step string) {
	if p == nil {
		return
	}
	if !slices.Contains(faultCancelSteps, step) {
		panic("unknown cancel step " + step)
	}
	p.mu.Lock()
	p.counts[step]++
	fire := step == p.step && p.counts[step] == p.nth
	p.mu.Unlock()
	if fire {
		p.cancel()
		p.fired.Store(true)
	}
}

type faultCancelEvents struct {
	domain.EventStore
	point *faultCancelPoint
}

func (s *faultCancelEvents) ReadAfter(ctx context.Context, after int64, limit int) ([]domain.EventEnvelope[any], error) {
	s.point.hit("read")
	events, err := s.EventStore.ReadAfter(ctx, after, limit)
	if err == nil && len(events) > 0 {
		s.point.hit("read-done")
	}
	return events, err
}

type faultCancelCheckpoints struct {
	subscriptions.CheckpointStore
	point *faultCancelPoint
}

func (s *faultCancelCheckpoints) Position(ctx context.Context, subscriber string) (int64, error) {
	s.point.hit("position")
	return s.CheckpointStore.Position(ctx, subscriber)
}

func (s *faultCancelCheckpoints) Acquire(ctx context.Context, subscriber string) (subscriptions.Batch, bool, error) {
	s.point.hit("acquire")
	batch, acquired, err := s.CheckpointStore.Acquire(ctx, subscriber)
	if err != nil || !acquired {
		return batch, acquired, err
	}
	s.point.hit("acquired")
	return &faultCancelBatch{Batch: batch, point: s.point}, true, nil
}

type faultCancelBatch struct {
	subscriptions.Batch
	point *faultCancelPoint
}

func (b *faultCancelBatch) Commit(ctx context.Context, position int64) error {
	b.point.hit("commit")
	err := b.Batch.Commit(ctx, position)
	b.point.hit("committed")
	return err
}

func (b *faultCancelBatch) Rollback() error {
	b.point.hit("rollback")
	return b.Batch.Rollback()
}

func (b *faultCancelBatch) Savepoint(ctx context.Context, name string) error {
	b.point.hit("savepoint")
	return b.Batch.Savepoint(ctx, name)
}

func (b *faultCancelBatch) RollbackToSavepoint(ctx context.Context, name string) error {
	b.point.hit("rollback-to-point")
	return b.Batch.RollbackToSavepoint(ctx, name)
}

type faultCancelLot struct {
	subscriptions.ParkingLot
	point *faultCancelPoint
}

func (l *faultCancelLot) Park(ctx context.Context, p subscriptions.ParkedEvent) error {
	l.point.hit("park")
	return l.ParkingLot.Park(ctx, p)
}
