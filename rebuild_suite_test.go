package subscriptions_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
)

// countProjection counts how often each event was applied: a table written
// through the batch transaction on the database backends, a map in memory.
type countProjection struct {
	e     *env
	db    *gorm.DB
	table string
	mu    sync.Mutex
	mem   map[string]int
}

func newCountProjection(t *testing.T, e *env) *countProjection {
	t.Helper()
	if e.DB == nil {
		return &countProjection{mem: map[string]int{}}
	}
	return &countProjection{e: e, db: e.DB, table: coreCountProjection(t, e.DB)}
}

func (p *countProjection) apply(ctx context.Context, ev coreEnvelope) error {
	if p.db != nil {
		return coreCountEvent(ctx, p.e, p.table, ev)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mem[ev.ID]++
	return nil
}

// clear empties the projection through the transaction in ctx (the
// cleanup of a reset).
func (p *countProjection) clear(ctx context.Context) error {
	if p.db != nil {
		return p.e.Exec(ctx, "DELETE FROM "+p.table)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.mem)
	return nil
}

func (p *countProjection) counts(t *testing.T) map[string]int {
	t.Helper()
	if p.db != nil {
		return coreCounts(t, p.db, p.table)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.mem))
	for k, v := range p.mem {
		out[k] = v
	}
	return out
}

// requireOnce checks that the projection applied exactly the events in
// want once each; memory, which is at-least-once (the events before a
// failing one are handled again when they are committed on their own),
// may have applied some of them more than once.
func (p *countProjection) requireOnce(t *testing.T, want map[string]int) {
	t.Helper()
	got := p.counts(t)
	if p.db == nil {
		for id, n := range got {
			require.Contains(t, want, id)
			require.GreaterOrEqual(t, n, 1)
			got[id] = 1
		}
	}
	require.Equal(t, want, got)
}

// onceEach is the counts of a projection that applied every id once.
func onceEach(ids []string) map[string]int {
	out := make(map[string]int, len(ids))
	for _, id := range ids {
		out[id] = 1
	}
	return out
}

// plainCheckpoints hides the optional interfaces of a checkpoint store.
type plainCheckpoints struct{ subscriptions.CheckpointStore }

// TestResetCheckpointWithSuite: the application's cleanup and the
// checkpoint move happen together or not at all, and no batch lands
// between them, on every backend.
func TestResetCheckpointWithSuite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			t.Run("a failing cleanup changes nothing", func(t *testing.T) {
				e := b.New(t)
				ids := appendN(t, e.Events, "rw.fail", 0, 12)
				proj := newCountProjection(t, e)
				sub := coreNewSub(t, "rw-fail", e.Events, e.Checkpoints, proj.apply, subscriptions.WithBatchSize(5))
				run := start(t, sub)
				head, err := sub.WaitCaughtUp(ctx)
				require.NoError(t, err)
				run.stop(t)

				boom := errors.New("boom")
				err = sub.ResetCheckpointWith(ctx, 0, func(ctx context.Context) error {
					if e.DB != nil {
						// A write that must be rolled back with the reset.
						if err := proj.clear(ctx); err != nil {
							return err
						}
					}
					return boom
				})
				require.ErrorIs(t, err, boom)
				require.Contains(t, err.Error(), `"rw-fail"`)
				p, err := e.Checkpoints.Position(ctx, sub.Name())
				require.NoError(t, err)
				require.Equal(t, head, p, "the checkpoint must not move when the cleanup fails")
				require.Equal(t, onceEach(ids), proj.counts(t), "the cleanup's writes must roll back")

				require.Error(t, sub.ResetCheckpointWith(ctx, -1, nil), "a negative position is refused")
			})

			t.Run("rebuild while a batch is in flight applies every event once", func(t *testing.T) {
				e := b.New(t)
				ids := appendN(t, e.Events, "rw.inflight", 0, 20)
				proj := newCountProjection(t, e)
				gate := newCoreGate()
				defer gate.open()
				var gated atomic.Bool
				handler := func(ctx context.Context, ev coreEnvelope) error {
					if err := proj.apply(ctx, ev); err != nil {
						return err
					}
					if ev.ID == ids[12] && gated.CompareAndSwap(false, true) {
						gate.pass()
					}
					return nil
				}
				sub := coreNewSub(t, "rw-inflight", e.Events, e.Checkpoints, handler, subscriptions.WithBatchSize(5))
				run := start(t, sub)
				gate.waitEntered(t) // the batch of events 10..14 is in flight

				resetDone := make(chan error, 1)
				go func() { resetDone <- sub.ResetCheckpointWith(ctx, 0, proj.clear) }()
				switch {
				case e.Postgres():
					require.Eventually(t, func() bool { return coreLockWaiters(t, e.PG) > 0 }, 20*time.Second, 5*time.Millisecond,
						"the reset should wait for the batch's row lock")
				case e.DB != nil:
					// SQLite: the reset aborts the batch in flight (its writes roll
					// back) and does not wait for it.
					require.NoError(t, <-resetDone)
					resetDone <- nil
				default:
					require.Eventually(t, func() bool {
						return coreGoroutineBlockedIn("subscriptions.(*MemoryCheckpointStore).fenced")
					}, 20*time.Second, time.Millisecond, "the reset should wait for the batch")
				}
				if e.DB == nil || e.Postgres() {
					require.Len(t, resetDone, 0, "the reset returned while the batch was in flight")
				}
				gate.open()
				require.NoError(t, <-resetDone)
				_, err := sub.WaitCaughtUp(ctx)
				require.NoError(t, err)
				run.stop(t)
				require.Equal(t, onceEach(ids), proj.counts(t))
			})

			t.Run("stores without CheckpointResetter are reported", func(t *testing.T) {
				e := b.New(t)
				sub := coreNewSub(t, "rw-plain", e.Events, plainCheckpoints{e.Checkpoints}, func(context.Context, coreEnvelope) error { return nil })
				require.ErrorIs(t, sub.ResetCheckpointWith(ctx, 0, nil), errors.ErrUnsupported)
				require.ErrorIs(t, sub.DeleteState(ctx), errors.ErrUnsupported)
			})
		})
	}
}

// TestDeleteStateSuite: retiring a name deletes its checkpoint and its
// parked events, and nothing of another name's.
func TestDeleteStateSuite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ids := appendN(t, e.Events, "ds.event", 0, 10)
			handler := func(ctx context.Context, ev coreEnvelope) error {
				if ev.ID == ids[3] {
					return errors.New("poison")
				}
				return nil
			}
			opts := []subscriptions.SubscriberOption{subscriptions.WithParkingLot(e.Parking), subscriptions.WithMaxRetries(0)}
			old := coreNewSub(t, "ds-old", e.Events, e.Checkpoints, handler, opts...)
			other := coreNewSub(t, "ds-other", e.Events, e.Checkpoints, handler, opts...)
			runOld, runOther := start(t, old), start(t, other)
			for _, s := range []*subscriptions.Subscriber{old, other} {
				_, err := s.WaitCaughtUp(ctx)
				require.NoError(t, err)
				parked, err := s.ListParked(ctx)
				require.NoError(t, err)
				require.Len(t, parked, 1)
			}
			require.ErrorIs(t, old.DeleteState(ctx), subscriptions.ErrRunning, "a running subscriber's state is not deleted")
			runOld.stop(t)
			runOther.stop(t)

			require.NoError(t, old.DeleteState(ctx))
			parked, err := old.ListParked(ctx)
			require.NoError(t, err)
			require.Empty(t, parked)
			p, err := e.Checkpoints.Position(ctx, "ds-old")
			require.NoError(t, err)
			require.Zero(t, p)
			if e.DB != nil {
				var n int64
				require.NoError(t, e.DB.Raw("SELECT count(*) FROM subscriber_checkpoints WHERE subscriber = ?", "ds-old").Scan(&n).Error)
				require.Zero(t, n, "the checkpoint row is deleted")
			}
			parked, err = other.ListParked(ctx)
			require.NoError(t, err)
			require.Len(t, parked, 1, "another name's parked events stay")
			p, err = e.Checkpoints.Position(ctx, "ds-other")
			require.NoError(t, err)
			require.NotZero(t, p, "another name's checkpoint stays")
		})
	}
}

// TestRunTwiceSuite: a second concurrent Run is refused; a Subscriber runs
// again after its Run returned.
func TestRunTwiceSuite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			rec := &coreRecorder{}
			sub := coreNewSub(t, "twice", e.Events, e.Checkpoints, func(ctx context.Context, ev coreEnvelope) error {
				rec.record(ctx, ev)
				return nil
			})
			ids := appendN(t, e.Events, "twice.event", 0, 5)
			run := start(t, sub)
			_, err := sub.WaitCaughtUp(ctx)
			require.NoError(t, err)

			second, cancel := context.WithCancel(ctx)
			defer cancel()
			err = sub.Run(second) // returns at once, without cancellation
			require.ErrorIs(t, err, subscriptions.ErrRunning)
			require.Equal(t, 1, strings.Count(err.Error(), `"twice"`), err.Error())
			require.Equal(t, 1, strings.Count(err.Error(), "subscriptions:"), err.Error())
			run.stop(t)

			ids = append(ids, appendN(t, e.Events, "twice.event", 5, 5)...)
			run = start(t, sub)
			_, err = sub.WaitCaughtUp(ctx)
			require.NoError(t, err)
			run.stop(t)
			require.Equal(t, ids, rec.ids(), "each event handled once, by one loop at a time")
		})
	}
}

// TestWaitCaughtUpSuite: WaitCaughtUp returns the head as of its call once
// the checkpoint reached it, and ctx's error when ctx ends first.
func TestWaitCaughtUpSuite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			appendN(t, e.Events, "wcu.event", 0, 23)
			sub := coreNewSub(t, "wcu", e.Events, e.Checkpoints, func(context.Context, coreEnvelope) error { return nil },
				subscriptions.WithBatchSize(4))

			short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
			defer cancel()
			_, err := sub.WaitCaughtUp(short) // nothing runs it
			require.ErrorIs(t, err, context.DeadlineExceeded)

			head, err := e.Events.HeadPosition(ctx)
			require.NoError(t, err)
			run := start(t, sub)
			got, err := sub.WaitCaughtUp(ctx)
			require.NoError(t, err)
			require.Equal(t, head, got)
			p, err := e.Checkpoints.Position(ctx, sub.Name())
			require.NoError(t, err)
			require.GreaterOrEqual(t, p, head)
			run.stop(t)
		})
	}
}

// failingPurger purges through its lot, then fails: the transaction the
// purge joined must roll back.
type failingPurger struct {
	subscriptions.ParkingLotPurger
}

var errPurge = errors.New("purge failed after deleting")

func (f failingPurger) Purge(ctx context.Context, subscriber string) error {
	if err := f.ParkingLotPurger.Purge(ctx, subscriber); err != nil {
		return err
	}
	return errPurge
}

// TestDeleteStateIsAtomic: on the database backends the checkpoint and the
// parked events are deleted in one transaction: a failure leaves both.
func TestDeleteStateIsAtomic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range dbEnvs() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ids := appendN(t, e.Events, "dsa.event", 0, 4)
			lot := failingPurger{e.Parking.(subscriptions.ParkingLotPurger)}
			sub := coreNewSub(t, "dsa", e.Events, e.Checkpoints, func(ctx context.Context, ev coreEnvelope) error {
				if ev.ID == ids[1] {
					return errors.New("poison")
				}
				return nil
			}, subscriptions.WithParkingLot(lot), subscriptions.WithMaxRetries(0))
			run := start(t, sub)
			head, err := sub.WaitCaughtUp(ctx)
			require.NoError(t, err)
			run.stop(t)

			require.ErrorIs(t, sub.DeleteState(ctx), errPurge)
			parked, err := sub.ListParked(ctx)
			require.NoError(t, err)
			require.Len(t, parked, 1, "the purge rolled back")
			require.Equal(t, head, faultCheckpoint(t, e.DB, "dsa"), "the checkpoint stays")
		})
	}
}

// hookPurger calls during, then purges through its lot.
type hookPurger struct {
	subscriptions.ParkingLotPurger
	during func()
}

func (h hookPurger) Purge(ctx context.Context, subscriber string) error {
	h.during()
	return h.ParkingLotPurger.Purge(ctx, subscriber)
}

// TestDeleteStateRefusesRun: while DeleteState runs, a Run of the same
// Subscriber is refused with ErrRunning (it would re-create the checkpoint
// at 0), and the Subscriber runs again afterwards, on every backend.
func TestDeleteStateRefusesRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			var sub *subscriptions.Subscriber
			var runErr error
			lot := hookPurger{ParkingLotPurger: e.Parking.(subscriptions.ParkingLotPurger), during: func() {
				cancelled, cancel := context.WithCancel(ctx)
				cancel() // a Run that would return at once if it started
				runErr = sub.Run(cancelled)
			}}
			sub = coreNewSub(t, "ds-run", e.Events, e.Checkpoints, func(context.Context, coreEnvelope) error { return nil },
				subscriptions.WithParkingLot(lot))
			require.NoError(t, sub.DeleteState(ctx))
			require.ErrorIs(t, runErr, subscriptions.ErrRunning, "a Run during DeleteState is refused")

			appendN(t, e.Events, "ds.run", 0, 3)
			run := start(t, sub)
			_, err := sub.WaitCaughtUp(ctx)
			require.NoError(t, err, "the Subscriber runs after DeleteState")
			run.stop(t)
		})
	}
}

// TestDeleteStatePurgeError: a purge that fails inside DeleteState is
// reported once, with the subscriber and the step named once each, on the
// database backends (the memory lot cannot fail); on pgx, whose lot is of
// another package, the subscriber is named twice.
func TestDeleteStatePurgeError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range dbEnvs() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			sub := coreNewSub(t, "dspe", e.Events, e.Checkpoints, func(context.Context, coreEnvelope) error { return nil },
				subscriptions.WithParkingLot(e.Parking))
			coreAdvance(t, e.Checkpoints, "dspe", 3)
			require.NoError(t, e.DB.Exec("DROP TABLE parked_events").Error) // the purge's statement fails
			err := sub.DeleteState(ctx)
			require.Error(t, err)
			msg := err.Error()
			if e.Pgx != nil {
				// A lot of another package names the subscriber twice (its
				// Purge's own context; see rawPurger), and the store calls
				// the purge its apply: the step and the cause are named.
				require.Equal(t, 0, strings.Count(msg, "subscriptions:"), msg)
				require.Contains(t, msg, `pgxstore: delete checkpoint of "dspe": `)
				require.Contains(t, msg, `purge parked events: pgxstore: purge parked events of "dspe": `)
				require.Contains(t, msg, "parked_events")
			} else {
				require.Equal(t, 1, strings.Count(msg, "subscriptions:"), msg)
				require.Equal(t, 1, strings.Count(msg, `"dspe"`), msg)
				require.Contains(t, msg, `delete checkpoint of "dspe": purge parked events: `)
			}
			require.NotContains(t, msg, "application's statements", msg)
			require.EqualValues(t, 3, faultCheckpoint(t, e.DB, "dspe"), "the checkpoint stays")
		})
	}
}

// TestRebuildPurgesParkedEvents: the in-place rebuild docs/rebuilds.md
// describes purges the name's parked events in the reset's function; the
// fixed handler then applies every event once and nothing stays parked to
// be replayed a second time, on every backend.
func TestRebuildPurgesParkedEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ids := appendN(t, e.Events, "rp.event", 0, 8)
			proj := newCountProjection(t, e)
			var fixed atomic.Bool
			handler := func(ctx context.Context, ev coreEnvelope) error {
				if ev.ID == ids[3] && !fixed.Load() {
					return errors.New("bug")
				}
				return proj.apply(ctx, ev)
			}
			lot := e.Parking.(subscriptions.ParkingLotPurger)
			sub := coreNewSub(t, "rp", e.Events, e.Checkpoints, handler,
				subscriptions.WithParkingLot(lot), subscriptions.WithMaxRetries(0))
			run := start(t, sub)
			_, err := sub.WaitCaughtUp(ctx)
			require.NoError(t, err)
			run.stop(t)
			parked, err := sub.ListParked(ctx)
			require.NoError(t, err)
			require.Len(t, parked, 1)

			fixed.Store(true) // the handler is fixed; rebuild
			require.NoError(t, sub.ResetCheckpointWith(ctx, 0, func(ctx context.Context) error {
				if err := proj.clear(ctx); err != nil {
					return err
				}
				return lot.Purge(ctx, sub.Name())
			}))
			run = start(t, sub)
			_, err = sub.WaitCaughtUp(ctx)
			require.NoError(t, err)
			run.stop(t)
			parked, err = sub.ListParked(ctx)
			require.NoError(t, err)
			require.Empty(t, parked, "nothing left to replay a second time")
			proj.requireOnce(t, onceEach(ids))
		})
	}
}
