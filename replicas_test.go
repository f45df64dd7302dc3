package subscriptions_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// coreHandled is one handler call of a replica.
type coreHandled struct {
	replica int
	id      string
	at      time.Time
}

// coreReplicaLog records the handler calls of all replicas.
type coreReplicaLog struct {
	mu    sync.Mutex
	calls []coreHandled
}

func (l *coreReplicaLog) add(replica int, id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, coreHandled{replica: replica, id: id, at: time.Now()})
}

func (l *coreReplicaLog) snapshot() []coreHandled {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]coreHandled(nil), l.calls...)
}

// TestReplicasProcessExactlyOnceAndTakeOver runs two, then five,
// Subscribers with the same name over one Postgres database, each on its
// own pool as separate processes would be. Between them they process every
// event exactly once; whenever the active replica stops (cancelled in the
// middle of a batch, which it drains), another one takes over.
func TestReplicasProcessExactlyOnceAndTakeOver(t *testing.T) {
	const poll = 25 * time.Millisecond
	for _, n := range []int{2, 5} {
		t.Run(fmt.Sprintf("%d replicas", n), func(t *testing.T) {
			pg := dbtest.NewPostgres(t)
			e := gormEnv(t, "postgres", pg.DB, pg)
			table := coreProjection(t, pg.DB, "replicas")
			const name = "core-replicas"

			// Before the replicas start: a backlog, with a gate on every 20th
			// event from the 20th on, one per replica that will be stopped.
			backlog := appendN(t, e.Events, "core.replica", 0, 20*n)
			gates := map[string]*coreGate{}
			var gateOrder []string
			for k := 1; k < n; k++ {
				id := backlog[20*k]
				gates[id] = newCoreGate()
				gateOrder = append(gateOrder, id)
			}
			for _, g := range gates {
				defer g.open()
			}

			calls := &coreReplicaLog{}
			runs := make([]*running, n)
			for i := 0; i < n; i++ {
				db := pg.Open(t)
				events, err := infrastructure.NewGormEventStore(db)
				require.NoError(t, err)
				cps, err := subscriptions.NewGormCheckpointStore(db)
				require.NoError(t, err)
				replica := i
				sub := coreNewSub(t, name, events, cps, func(ctx context.Context, ev coreEnvelope) error {
					if err := project(ctx, table, ev); err != nil {
						return err
					}
					calls.add(replica, ev.ID)
					if g := gates[ev.ID]; g != nil {
						g.pass()
					}
					return nil
				}, subscriptions.WithBatchSize(5), subscriptions.WithPollInterval(poll))
				runs[i] = start(t, sub)
			}

			// Meanwhile, new events keep arriving.
			var appended []string
			appendErr := make(chan error, 1)
			go func() {
				for i := 0; i < 20; i++ {
					ev := domain.NewEventEnvelope[any](map[string]any{"n": i}, fmt.Sprintf("live-%d", i%4), "core.replica.live", 0)
					if err := e.Events.Append(context.Background(), ev.AggregateID, -1, ev); err != nil {
						appendErr <- err
						return
					}
					appended = append(appended, ev.ID)
				}
				appendErr <- nil
			}()

			stopped := map[int]bool{}
			for _, gateID := range gateOrder {
				gate := gates[gateID]
				gate.waitEntered(t)
				active := -1
				for _, c := range calls.snapshot() {
					if c.id == gateID {
						active = c.replica
					}
				}
				require.GreaterOrEqual(t, active, 0)
				require.False(t, stopped[active], "a stopped replica handled an event")

				// Stop the active replica in the middle of its batch.
				runs[active].cancel()
				require.False(t, runs[active].returned(), "Run returned before draining its batch")
				gate.open()
				res := runs[active].wait(t)
				require.False(t, res.panicked)
				require.NoError(t, res.err)
				stopped[active] = true

				// Another replica takes over: measure from the stopped replica's
				// last handler call to the first call of any other replica after it.
				var last time.Time
				for _, c := range calls.snapshot() {
					if c.replica == active && c.at.After(last) {
						last = c.at
					}
				}
				var first coreHandled
				require.Eventually(t, func() bool {
					for _, c := range calls.snapshot() {
						if c.replica != active && c.at.After(last) {
							first = c
							return true
						}
					}
					return false
				}, 30*time.Second, time.Millisecond, "no replica took over from replica %d", active)
				require.False(t, stopped[first.replica])
				gap := first.at.Sub(last)
				t.Logf("replica %d stopped; replica %d took over after %v (poll interval %v)", active, first.replica, gap, poll)
				require.LessOrEqual(t, gap, poll+faultRecoverySlack, "takeover waited for more than the next poll (see faultRecoverySlack)")
			}

			require.NoError(t, <-appendErr)
			all := append(append([]string(nil), backlog...), appended...)
			require.Eventually(t, func() bool {
				var count int64
				return pg.DB.Raw("SELECT count(*) FROM "+table).Scan(&count).Error == nil && count == int64(len(all))
			}, 30*time.Second, 5*time.Millisecond)
			for i, r := range runs {
				if !stopped[i] {
					r.stop(t)
				}
			}

			// Exactly once: one handler call per event, and the projection
			// (primary key on event_id) holds the whole feed in order.
			feed := coreFeed(t, e.Events)
			require.ElementsMatch(t, all, coreIDs(feed))
			require.Equal(t, coreIDs(feed), projected(t, pg.DB, table))
			perEvent := map[string]int{}
			perReplica := make([]int, n)
			for _, c := range calls.snapshot() {
				perEvent[c.id]++
				perReplica[c.replica]++
			}
			require.Len(t, perEvent, len(all))
			for id, k := range perEvent {
				require.Equal(t, 1, k, "event %s handled %d times", id, k)
			}
			pos, err := e.Checkpoints.Position(context.Background(), name)
			require.NoError(t, err)
			require.Equal(t, feed[len(feed)-1].Position, pos)
			t.Logf("events handled per replica: %v", perReplica)
		})
	}
}

// TestReplicaStopsWhileAnotherHoldsTheFirstBatch: a replica that finds the
// checkpoint held by another process skips the cycle, so it can be stopped
// at once — even on the subscriber's very first batch, when the other
// process is still creating the checkpoint row.
func TestReplicaStopsWhileAnotherHoldsTheFirstBatch(t *testing.T) {
	t.Parallel()
	pg := dbtest.NewPostgres(t)
	e := gormEnv(t, "postgres", pg.DB, pg)
	ids := appendN(t, e.Events, "core.first", 0, 5)
	const name = "core-first-batch"

	gate := newCoreGate()
	defer gate.open()
	holder := coreNewSub(t, name, e.Events, e.Checkpoints, func(ctx context.Context, ev coreEnvelope) error {
		if ev.ID == ids[0] {
			gate.pass()
		}
		return nil
	})
	holderRun := start(t, holder)
	gate.waitEntered(t) // the first batch, which inserted the row, is open

	db := pg.Open(t)
	events, err := infrastructure.NewGormEventStore(db)
	require.NoError(t, err)
	gormCPs, err := subscriptions.NewGormCheckpointStore(db)
	require.NoError(t, err)
	cps := &coreSkipCounter{CheckpointStore: gormCPs}
	var handled atomic.Int32
	other := coreNewSub(t, name, events, cps, func(context.Context, coreEnvelope) error { handled.Add(1); return nil })
	otherRun := start(t, other)
	// The other replica must skip (Acquire returns acquired=false) rather
	// than queue behind the first batch's row: see it skip twice.
	require.Eventually(t, func() bool { return cps.skipped.Load() >= 2 }, 20*time.Second, time.Millisecond,
		"the other replica never skipped the held checkpoint")
	require.Zero(t, coreLockWaiters(t, pg), "a replica queued on the checkpoint row lock")
	otherRun.cancel()
	require.Eventually(t, otherRun.returned, 10*time.Second, 5*time.Millisecond,
		"a replica waiting for another's first batch could not be stopped")
	require.NoError(t, otherRun.wait(t).err)
	gate.open()
	holderRun.stop(t)
	require.Zero(t, handled.Load())
}

// coreSkipCounter counts the Acquire calls that returned acquired=false.
type coreSkipCounter struct {
	subscriptions.CheckpointStore
	skipped atomic.Int32
}

func (c *coreSkipCounter) Acquire(ctx context.Context, name string) (subscriptions.Batch, bool, error) {
	b, ok, err := c.CheckpointStore.Acquire(ctx, name)
	if err == nil && !ok {
		c.skipped.Add(1)
	}
	return b, ok, err
}
