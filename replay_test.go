package subscriptions_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestReplayParked parks a poison event through a running subscriber and
// replays it: the event is loaded from the store and handed to the handler
// inside the replay transaction; a failed replay leaves the entry (with
// one more attempt, its error and time) and rolls back the handler's
// writes; a successful one commits them and clears the entry; a stored
// event that is not parked is ErrEventNotParked and an unknown one
// domain.ErrEventNotFound.
func TestReplayParked(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			before, poison, after := parkFeed(t, e, 1, 1)
			var failing atomic.Bool
			failing.Store(true)
			var (
				seenMu sync.Mutex
				seen   []domain.EventEnvelope[any]
			)
			probe := newParkProbe()
			h := parkHandler(e, probe, func(ev domain.EventEnvelope[any], _ int) error {
				if ev.ID != poison.ID {
					return nil
				}
				seenMu.Lock()
				seen = append(seen, ev)
				seenMu.Unlock()
				if failing.Load() {
					return errParkPoison
				}
				return nil
			})
			sub := parkSubscriber(t, e, "park-replay", h, subscriptions.WithMaxRetries(1), subscriptions.WithParkingLot(e.Parking))
			r := start(t, sub)
			parked := parkWaitParked(t, sub, 1)
			waitCaughtUp(t, sub)
			r.stop(t)
			ctx := context.Background()
			runs := probe.count(poison.ID)

			t.Run("not parked", func(t *testing.T) {
				for _, id := range []string{before[0], after[0]} {
					err := sub.ReplayParked(ctx, id)
					require.ErrorIs(t, err, subscriptions.ErrEventNotParked, "event %s", id)
					require.Contains(t, err.Error(), "park-replay")
				}
				// Unknown to the store: the original loads the event first.
				err := sub.ReplayParked(ctx, "park-no-such-event")
				require.ErrorIs(t, err, domain.ErrEventNotFound)
				require.NotErrorIs(t, err, subscriptions.ErrEventNotParked)
				require.Contains(t, err.Error(), "park-replay")
				require.Equal(t, runs, probe.count(poison.ID))
				require.Zero(t, probe.count("park-no-such-event"))
			})

			t.Run("failed replay", func(t *testing.T) {
				err := sub.ReplayParked(ctx, poison.ID)
				// On the database backends the handler wrote through the replay
				// transaction first (parkHandler fails with another error when
				// there is none).
				require.ErrorIs(t, err, errParkPoison)
				require.Contains(t, err.Error(), poison.ID)
				require.Equal(t, runs+1, probe.count(poison.ID))
				still, err := sub.ListParked(ctx)
				require.NoError(t, err)
				require.Len(t, still, 1, "a failed replay leaves the entry")
				require.Equal(t, parked[0].Attempts+1, still[0].Attempts, "a failed replay counts as an attempt")
				require.Contains(t, still[0].Error, errParkPoison.Error(), "a failed replay records its error")
				require.False(t, still[0].ParkedAt.Before(parked[0].ParkedAt), "a failed replay records its time")
				require.Equal(t, poison.AggregateID, still[0].AggregateID)
				if e.DB != nil {
					require.Equal(t, parkConcat(before, after), projected(t, e.DB, parkProjection), "the failed replay's write was rolled back")
				}
			})

			t.Run("successful replay", func(t *testing.T) {
				failing.Store(false)
				require.NoError(t, sub.ReplayParked(ctx, poison.ID))
				require.Equal(t, runs+2, probe.count(poison.ID))
				seenMu.Lock()
				last := seen[len(seen)-1]
				seenMu.Unlock()
				require.Equal(t, poison.ID, last.ID)
				require.Equal(t, poison.EventType, last.EventType)
				require.Equal(t, poison.AggregateID, last.AggregateID)
				require.Equal(t, poison.Position, last.Position, "the event is loaded from the store, position included")
				require.Equal(t, poison.Payload, last.Payload)

				left, err := sub.ListParked(ctx)
				require.NoError(t, err)
				require.Empty(t, left, "a successful replay clears the entry")
				if e.DB != nil {
					require.Equal(t, parkConcat(before, []string{poison.ID}, after), projected(t, e.DB, parkProjection), "the replay's write committed")
				}
				err = sub.ReplayParked(ctx, poison.ID)
				require.ErrorIs(t, err, subscriptions.ErrEventNotParked, "a replayed event is no longer parked")
				require.Equal(t, runs+2, probe.count(poison.ID))
			})
		})
	}
}

// TestReplayParkedSeesEntryInItsTransaction checks that on the database
// backends the replay handler runs inside the transaction that deletes the
// entry: the handler reads its own parked row through TxFromContext (on
// pgx pgxstore.TxFromContext), and the entry is gone only once the replay
// has committed.
func TestReplayParkedSeesEntryInItsTransaction(t *testing.T) {
	t.Parallel()
	for _, b := range dbEnvs() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ev := parkStoredEvent(t, e)
			var inTx int64 = -1
			sub := parkSubscriber(t, e, "park-replay-tx", func(ctx context.Context, got domain.EventEnvelope[any]) error {
				if !e.InTx(ctx) {
					return errors.New("no replay transaction in the handler's context")
				}
				return e.QueryRow(ctx, "SELECT count(*) FROM parked_events WHERE subscriber = ? AND event_id = ?", "park-replay-tx", got.ID).Scan(&inTx)
			}, subscriptions.WithParkingLot(e.Parking))
			require.NoError(t, e.Parking.Park(context.Background(), parkEntry("park-replay-tx", ev.ID, ev.Position)))
			parkPastEvent(t, e, "park-replay-tx", ev)
			require.NoError(t, sub.ReplayParked(context.Background(), ev.ID))
			require.EqualValues(t, 1, inTx, "the handler sees the parked row through the replay transaction")
			left, err := sub.ListParked(context.Background())
			require.NoError(t, err)
			require.Empty(t, left)
		})
	}
}

// parkStoredEvent appends one event and returns it as stored.
func parkStoredEvent(t *testing.T, e *env) domain.EventEnvelope[any] {
	t.Helper()
	id := appendN(t, e.Events, "park.replay", 0, 1)[0]
	ev, err := e.Events.GetEventByID(context.Background(), id)
	require.NoError(t, err)
	return ev
}

// parkPGEnv is a Postgres env (GORM's, or with pgx pgx's) whose pool sets
// a unique application_name, so that pg_stat_activity can tell what this
// test's sessions wait for.
func parkPGEnv(t *testing.T, pgx bool) (e *env, admin *gorm.DB, app string) {
	t.Helper()
	pg := dbtest.NewPostgres(t)
	app = fmt.Sprintf("park_%d", time.Now().UnixNano())
	dsn := pg.DSN + "&application_name=" + app
	if pgx {
		return pgxEnvOn(t, pg, dbtest.OpenPgxDSN(t, dsn)), pg.DB, app
	}
	db := dbtest.OpenPostgresDSN(t, dsn)
	return gormEnv(t, "postgres", db, pg), pg.DB, app
}

// parkWaitLockWait waits until a session of app waits on a lock while
// running a statement matching like.
func parkWaitLockWait(t *testing.T, admin *gorm.DB, app, like string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int64
		err := admin.Raw(`SELECT count(*) FROM pg_stat_activity
			WHERE application_name = ? AND wait_event_type = 'Lock' AND query LIKE ?`, app, like).Scan(&n).Error
		return err == nil && n > 0
	}, 30*time.Second, 5*time.Millisecond, "no session of %s waits on a lock running %q", app, like)
}

// parkGate is a handler that blocks in every run until released.
type parkGate struct {
	runs    atomic.Int32
	entered chan struct{}
	release chan struct{}
}

func newParkGate() *parkGate {
	return &parkGate{entered: make(chan struct{}, 8), release: make(chan struct{})}
}

func (g *parkGate) handler(ctx context.Context, _ domain.EventEnvelope[any]) error {
	g.runs.Add(1)
	g.entered <- struct{}{}
	<-g.release
	return nil
}

func (g *parkGate) waitEntered(t *testing.T) {
	t.Helper()
	select {
	case <-g.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the replay handler was never entered")
	}
}

// parkAt is a timestamp at the precision every backend keeps.
func parkAt(offset time.Duration) time.Time {
	return time.Date(2025, 3, 4, 5, 6, 7, 891011000, time.UTC).Add(offset)
}

// parkEntry is a parked entry of subscriber for the event at position.
func parkEntry(subscriber, eventID string, position int64) subscriptions.ParkedEvent {
	return subscriptions.ParkedEvent{
		Subscriber: subscriber,
		EventID:    eventID,
		EventType:  "park.suite",
		Position:   position,
		Error:      "park: failed at " + eventID,
		Attempts:   3,
		ParkedAt:   parkAt(time.Duration(position) * time.Second),
	}
}

// parkRequireSame compares two entries, the time by instant.
func parkRequireSame(t *testing.T, want, got subscriptions.ParkedEvent) {
	t.Helper()
	require.True(t, want.ParkedAt.Equal(got.ParkedAt), "parked_at: want %v, got %v", want.ParkedAt, got.ParkedAt)
	want.ParkedAt, got.ParkedAt = time.Time{}, time.Time{}
	require.Equal(t, want, got)
}

// parkAsync runs f on a goroutine and returns the channel of its result.
func parkAsync(f func() error) <-chan error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	return done
}

func parkResult(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("a replay did not return")
		return nil
	}
}

// TestReplayParkedConcurrently runs two replays of one parked event at
// once through a subscriber: the handler runs at most once, and the second
// replay, started while the first runs, is refused with
// ErrReplayInProgress (on single-connection in-memory SQLite it queues and
// then finds the entry gone). A replay after the first one cleared the
// entry finds it gone.
func TestReplayParkedConcurrently(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ev := parkStoredEvent(t, e)
			gate := newParkGate()
			sub := parkSubscriber(t, e, "park-replay-race", gate.handler, subscriptions.WithParkingLot(e.Parking))
			require.NoError(t, e.Parking.Park(context.Background(), parkEntry("park-replay-race", ev.ID, ev.Position)))
			parkPastEvent(t, e, "park-replay-race", ev)
			ctx := context.Background()

			release := sync.OnceFunc(func() { close(gate.release) })
			defer release()
			first := parkAsync(func() error { return sub.ReplayParked(ctx, ev.ID) })
			gate.waitEntered(t)
			second := parkAsync(func() error { return sub.ReplayParked(ctx, ev.ID) })
			if b.Name == "sqlite-memory" {
				// One connection: the second replay's event load queues
				// behind the first replay's transaction.
				// It then finds the entry cleared, or, when it gets the
				// connection back before the first replay has dropped its
				// in-process claim, the replay still in progress: either way
				// the handler does not run again.
				release()
				require.NoError(t, parkResult(t, first))
				err := parkResult(t, second)
				if !errors.Is(err, subscriptions.ErrReplayInProgress) {
					require.ErrorIs(t, err, subscriptions.ErrEventNotParked, "the queued replay finds the entry cleared")
				}
			} else {
				err := parkResult(t, second)
				release()
				require.ErrorIs(t, err, subscriptions.ErrReplayInProgress, "the second replay conflicts while the first runs")
				require.NoError(t, parkResult(t, first))
			}
			require.ErrorIs(t, sub.ReplayParked(ctx, ev.ID), subscriptions.ErrEventNotParked, "a later replay finds the entry cleared")
			require.EqualValues(t, 1, gate.runs.Load(), "the handler ran more than once for one parked entry")
			left, err := sub.ListParked(ctx)
			require.NoError(t, err)
			require.Empty(t, left)
		})
	}
}

// TestGormParkingLotReplayRaceAcrossHandles races two replays of one
// entry through two GormParkingLots on separate handles to the same
// database, as two processes (Postgres) or two parts of one process
// (SQLite file) would: the second is refused with ErrReplayInProgress.
func TestGormParkingLotReplayRaceAcrossHandles(t *testing.T) {
	t.Parallel()
	for _, b := range dbtest.GormBackends() {
		if b.Name == "sqlite-memory" {
			continue // one connection holds the whole database
		}
		t.Run(b.Name, func(t *testing.T) {
			var db, otherDB *gorm.DB
			if b.Postgres {
				pg := dbtest.NewPostgres(t)
				db, otherDB = pg.DB, pg.Open(t)
			} else {
				db = b.Open(t)
				var file string
				require.NoError(t, db.Raw("SELECT file FROM pragma_database_list WHERE name = 'main'").Scan(&file).Error)
				otherDB = dbtest.OpenSQLite(t, dbtest.SQLiteFileDSN(file))
			}
			lot, err := subscriptions.NewGormParkingLot(db)
			require.NoError(t, err)
			other, err := subscriptions.NewGormParkingLot(otherDB)
			require.NoError(t, err)
			ctx := context.Background()
			require.NoError(t, lot.Park(ctx, parkEntry("park-race-handles", "ev-1", 1)))
			ev := domain.EventEnvelope[any]{ID: "ev-1", EventType: "park.suite", Position: 1}

			gate := newParkGate()
			release := sync.OnceFunc(func() { close(gate.release) })
			defer release()
			first := parkAsync(func() error { return lot.Replay(ctx, "park-race-handles", "ev-1", ev, gate.handler) })
			gate.waitEntered(t)
			err = other.Replay(ctx, "park-race-handles", "ev-1", ev, gate.handler)
			release()
			require.ErrorIs(t, err, subscriptions.ErrReplayInProgress)
			require.NoError(t, parkResult(t, first))
			require.EqualValues(t, 1, gate.runs.Load())
			err = other.Replay(ctx, "park-race-handles", "ev-1", ev, gate.handler)
			require.ErrorIs(t, err, subscriptions.ErrEventNotParked)
		})
	}
}

// TestReplayParkedKeepsEntryReparkedMeanwhile re-parks an event while its
// replay runs (a fresh failure): the entry must survive the replay. On the
// memory lot the handler parks it again itself; on the database lots a
// concurrent Park from another goroutine waits for the replay (on Postgres
// it is seen waiting on the row lock) and the entry exists afterwards.
func TestReplayParkedKeepsEntryReparkedMeanwhile(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			var e *env
			var admin *gorm.DB
			var app string
			if b.Postgres {
				e, admin, app = parkPGEnv(t, b.Name == "pgx")
			} else {
				e = b.New(t)
			}
			ev := parkStoredEvent(t, e)
			ctx := context.Background()
			entry := parkEntry("park-replay-repark", ev.ID, ev.Position)
			fresh := entry
			fresh.Error = "park: failed again meanwhile"
			fresh.Attempts = 9
			fresh.ParkedAt = entry.ParkedAt.Add(time.Minute)
			require.NoError(t, e.Parking.Park(ctx, entry))
			parkPastEvent(t, e, "park-replay-repark", ev)

			if b.Name == "memory" {
				sub := parkSubscriber(t, e, "park-replay-repark", func(hctx context.Context, _ domain.EventEnvelope[any]) error {
					return e.Parking.Park(hctx, fresh)
				}, subscriptions.WithParkingLot(e.Parking))
				require.NoError(t, sub.ReplayParked(ctx, ev.ID))
			} else {
				gate := newParkGate()
				sub := parkSubscriber(t, e, "park-replay-repark", gate.handler, subscriptions.WithParkingLot(e.Parking))
				replay := parkAsync(func() error { return sub.ReplayParked(ctx, ev.ID) })
				gate.waitEntered(t)
				park := parkAsync(func() error { return e.Parking.Park(ctx, fresh) })
				if b.Postgres {
					parkWaitLockWait(t, admin, app, "%INSERT INTO parked_events%")
					select {
					case err := <-park:
						t.Fatalf("Park returned (%v) while the replay held the entry", err)
					default:
					}
				}
				close(gate.release)
				require.NoError(t, parkResult(t, replay))
				require.NoError(t, parkResult(t, park))
			}

			got, err := e.Parking.List(ctx, "park-replay-repark")
			require.NoError(t, err)
			require.Len(t, got, 1, "the entry re-parked during the replay was cleared")
			parkRequireSame(t, fresh, got[0])
		})
	}
}

// parkPastEvent moves the subscriber's checkpoint past a parked event, as
// parking it does: ReplayParked refuses an event the subscriber will
// deliver again.
func parkPastEvent(t *testing.T, e *env, name string, ev domain.EventEnvelope[any]) {
	t.Helper()
	require.NoError(t, e.Checkpoints.Reset(context.Background(), name, ev.Position))
}
