package subscriptions_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// parkProjection is the projection table the tests of this file family
// write through the batch transaction.
const parkProjection = "park_proj"

// parkProbe records every handler invocation per event ID.
type parkProbe struct {
	mu       sync.Mutex
	attempts map[string][]time.Time
	handled  map[string]int // invocations that returned nil
}

func newParkProbe() *parkProbe {
	return &parkProbe{attempts: map[string][]time.Time{}, handled: map[string]int{}}
}

// attempt records an invocation and returns its number (from 1).
func (p *parkProbe) attempt(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.attempts[id] = append(p.attempts[id], time.Now())
	return len(p.attempts[id])
}

func (p *parkProbe) succeeded(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.handled[id]++
}

func (p *parkProbe) attemptsOf(id string) []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.attempts[id]...)
}

func (p *parkProbe) count(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.attempts[id])
}

func (p *parkProbe) handledCount(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.handled[id]
}

// parkHandler returns a handler that records each invocation in probe,
// writes the event into parkProjection through the batch transaction (on
// database backends), and then fails with fail(ev, attempt) when that is
// non-nil. A failing attempt has therefore always written something that
// must be discarded.
func parkHandler(e *env, probe *parkProbe, fail func(ev domain.EventEnvelope[any], attempt int) error) subscriptions.Handler {
	return func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		n := probe.attempt(ev.ID)
		if e.DB != nil {
			if err := e.project(ctx, parkProjection, ev); err != nil {
				return err
			}
		}
		if fail != nil {
			if err := fail(ev, n); err != nil {
				return err
			}
		}
		probe.succeeded(ev.ID)
		return nil
	}
}

// parkSubscriber builds a subscriber with fast polling and fast retries;
// opts come last and override them.
func parkSubscriber(t *testing.T, e *env, name string, h subscriptions.Handler, opts ...subscriptions.SubscriberOption) *subscriptions.Subscriber {
	t.Helper()
	base := []subscriptions.SubscriberOption{
		subscriptions.WithLogger(quietLogger()),
		subscriptions.WithPollInterval(10 * time.Millisecond),
		subscriptions.WithRetryBackoff(time.Millisecond, 8*time.Millisecond),
	}
	sub, err := subscriptions.NewSubscriber(name, e.Events, e.Checkpoints, h, append(base, opts...)...)
	require.NoError(t, err)
	return sub
}

// parkFeed creates the parkProjection table (on a database backend, for
// parkHandler to write to) and appends nBefore "park.ok" events, one
// "park.poison" event and nAfter "park.ok" events; it returns the IDs and
// the poison event as stored (with its position).
func parkFeed(t *testing.T, e *env, nBefore, nAfter int) (before []string, poison domain.EventEnvelope[any], after []string) {
	t.Helper()
	if e.DB != nil {
		createProjection(t, e.DB, parkProjection)
	}
	before = appendN(t, e.Events, "park.ok", 0, nBefore)
	id := appendN(t, e.Events, "park.poison", nBefore, 1)[0]
	after = appendN(t, e.Events, "park.ok", nBefore+1, nAfter)
	poison, err := e.Events.GetEventByID(context.Background(), id)
	require.NoError(t, err)
	return before, poison, after
}

// parkWaitParked waits until the subscriber lists n parked events and
// returns them.
func parkWaitParked(t *testing.T, sub *subscriptions.Subscriber, n int) []subscriptions.ParkedEvent {
	t.Helper()
	var parked []subscriptions.ParkedEvent
	require.Eventually(t, func() bool {
		p, err := sub.ListParked(context.Background())
		if err != nil || len(p) != n {
			return false
		}
		parked = p
		return true
	}, 30*time.Second, 5*time.Millisecond, "subscriber %q did not park %d event(s)", sub.Name(), n)
	return parked
}

// parkPosition reads the subscriber's committed checkpoint.
func parkPosition(t *testing.T, e *env, name string) int64 {
	t.Helper()
	pos, err := e.Checkpoints.Position(context.Background(), name)
	require.NoError(t, err)
	return pos
}

// parkConcat joins ID lists.
func parkConcat(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// parkRequireProcessed checks that exactly ids were processed: on database
// backends the projection holds each exactly once, in feed order (and
// nothing else: no failed attempt's write survived); on memory each was
// handled successfully at least once.
func parkRequireProcessed(t *testing.T, e *env, probe *parkProbe, ids []string) {
	t.Helper()
	if e.DB != nil {
		require.Equal(t, ids, projected(t, e.DB, parkProjection))
		return
	}
	for _, id := range ids {
		require.GreaterOrEqual(t, probe.handledCount(id), 1, "event %s was never handled successfully", id)
	}
}

// parkFailingCommitStore wraps a CheckpointStore so that the first Commit
// of a batch to position failAt is killed: the batch is rolled back and
// Commit returns an error, as if the process had crashed between parking
// the event and advancing the checkpoint.
type parkFailingCommitStore struct {
	subscriptions.CheckpointStore
	failAt int64
	// afterKill runs right after the killed batch was rolled back.
	afterKill func()
	killed    atomic.Int32
}

func (s *parkFailingCommitStore) Acquire(ctx context.Context, subscriber string) (subscriptions.Batch, bool, error) {
	b, ok, err := s.CheckpointStore.Acquire(ctx, subscriber)
	if err != nil || !ok {
		return b, ok, err
	}
	return &parkFailingBatch{Batch: b, store: s}, true, nil
}

type parkFailingBatch struct {
	subscriptions.Batch
	store *parkFailingCommitStore
}

var errParkKilledCommit = errors.New("park test: batch killed before its commit")

func (b *parkFailingBatch) Commit(ctx context.Context, position int64) error {
	if position == b.store.failAt && b.store.killed.CompareAndSwap(0, 1) {
		if err := b.Batch.Rollback(); err != nil {
			return errors.Join(errParkKilledCommit, err)
		}
		if b.store.afterKill != nil {
			b.store.afterKill()
		}
		return errParkKilledCommit
	}
	return b.Batch.Commit(ctx, position)
}

// parkCountingLot counts Park calls on a wrapped ParkingLot.
type parkCountingLot struct {
	subscriptions.ParkingLot
	parks atomic.Int32
}

func (l *parkCountingLot) Park(ctx context.Context, p subscriptions.ParkedEvent) error {
	l.parks.Add(1)
	return l.ParkingLot.Park(ctx, p)
}

// TestParkingCommitsAtomicallyWithCheckpoint kills the batch that parks a
// poison event between the park and the checkpoint advance: with a
// GormParkingLot on the checkpoint store's *gorm.DB (a pgxstore.ParkingLot
// on the checkpoint store's pool) the park rolls back with the batch, so
// the event is neither lost nor parked twice.
func TestParkingCommitsAtomicallyWithCheckpoint(t *testing.T) {
	t.Parallel()
	const maxRetries = 2
	for _, b := range dbEnvs() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			before, poison, after := parkFeed(t, e, 2, 2)
			errPoison := errors.New("park: poison refused")

			var listedAfterKill []subscriptions.ParkedEvent
			var listErr error
			cps := &parkFailingCommitStore{CheckpointStore: e.Checkpoints, failAt: poison.Position}
			cps.afterKill = func() {
				listedAfterKill, listErr = e.Parking.List(context.Background(), "park-atomic")
			}
			lot := &parkCountingLot{ParkingLot: e.Parking}
			probe := newParkProbe()
			h := parkHandler(e, probe, func(ev domain.EventEnvelope[any], _ int) error {
				if ev.ID == poison.ID {
					return errPoison
				}
				return nil
			})
			sub, err := subscriptions.NewSubscriber("park-atomic", e.Events, cps, h,
				subscriptions.WithLogger(quietLogger()),
				subscriptions.WithPollInterval(10*time.Millisecond),
				subscriptions.WithRetryBackoff(time.Millisecond, 4*time.Millisecond),
				subscriptions.WithMaxRetries(maxRetries),
				subscriptions.WithParkingLot(lot))
			require.NoError(t, err)

			r := start(t, sub)
			parked := parkWaitParked(t, sub, 1)
			waitCaughtUp(t, sub)
			r.stop(t)

			require.EqualValues(t, 1, cps.killed.Load(), "the parking batch was never killed")
			require.NoError(t, listErr)
			require.Empty(t, listedAfterKill, "the park survived the killed batch: parking is not atomic with the checkpoint advance")
			require.GreaterOrEqual(t, lot.parks.Load(), int32(2), "the event was not parked again after the killed batch")

			parked, err = sub.ListParked(context.Background())
			require.NoError(t, err)
			require.Len(t, parked, 1, "parked exactly once")
			require.Equal(t, poison.ID, parked[0].EventID)
			require.Equal(t, poison.Position, parked[0].Position)
			require.Equal(t, 1+maxRetries, parked[0].Attempts)
			require.Contains(t, parked[0].Error, errPoison.Error())
			var rows int64
			require.NoError(t, e.DB.Raw("SELECT count(*) FROM parked_events").Scan(&rows).Error)
			require.EqualValues(t, 1, rows)

			head, err := e.Events.HeadPosition(context.Background())
			require.NoError(t, err)
			require.Equal(t, head, parkPosition(t, e, "park-atomic"), "checkpoint is past the poison event")
			parkRequireProcessed(t, e, probe, parkConcat(before, after))
		})
	}
}

// TestParkingLotOnForeignDatabase parks through a GormParkingLot built on
// another *gorm.DB than the checkpoint store (on pgx: a pgxstore.ParkingLot
// on another pool): the row must land in the lot's own database, never in
// the checkpoint database through the batch's (foreign) transaction.
func TestParkingLotOnForeignDatabase(t *testing.T) {
	t.Parallel()
	// pgxLot is a pgxstore.ParkingLot on pool, with a GORM handle on the
	// same database for the checks.
	pgxLot := func(t *testing.T, pool *pgxpool.Pool, db *gorm.DB) (subscriptions.ParkingLot, *gorm.DB) {
		lot, err := pgxstore.NewParkingLot(context.Background(), pool)
		require.NoError(t, err)
		return lot, db
	}
	cases := []struct {
		name    string
		backend string
		// lotDB opens the lot's database given the checkpoint env.
		lotDB func(t *testing.T, e *env) *gorm.DB
		// lot, when set, builds the lot itself (instead of a GormParkingLot
		// on lotDB) and returns it with a handle on its database.
		lot func(t *testing.T, e *env) (subscriptions.ParkingLot, *gorm.DB)
		// separate: the lot's database is not the checkpoint database.
		separate bool
		bug      string
	}{
		{name: "sqlite-memory/second-database", backend: "sqlite-memory", lotDB: func(t *testing.T, _ *env) *gorm.DB { return dbtest.NewSQLiteMemory(t) }, separate: true},
		{name: "sqlite-file/second-file", backend: "sqlite-file", lotDB: func(t *testing.T, _ *env) *gorm.DB { return dbtest.NewSQLiteFile(t) }, separate: true},
		{name: "postgres/second-schema", backend: "postgres", lotDB: func(t *testing.T, _ *env) *gorm.DB { return dbtest.NewPostgres(t).DB }, separate: true},
		{name: "postgres/second-pool-same-schema", backend: "postgres", lotDB: func(t *testing.T, e *env) *gorm.DB { return e.PG.Open(t) }},
		{name: "pgx/second-schema", backend: "pgx", lot: func(t *testing.T, _ *env) (subscriptions.ParkingLot, *gorm.DB) {
			pg := dbtest.NewPostgres(t)
			return pgxLot(t, pg.OpenPgx(t), pg.DB)
		}, separate: true},
		{name: "pgx/second-pool-same-schema", backend: "pgx", lot: func(t *testing.T, e *env) (subscriptions.ParkingLot, *gorm.DB) {
			return pgxLot(t, e.PG.OpenPgx(t), e.DB)
		}},
		{name: "sqlite-file/second-handle-same-file", backend: "sqlite-file", lotDB: func(t *testing.T, e *env) *gorm.DB {
			var path string
			require.NoError(t, e.DB.Raw("SELECT file FROM pragma_database_list WHERE name = 'main'").Scan(&path).Error)
			require.NotEmpty(t, path)
			return dbtest.OpenSQLite(t, dbtest.SQLiteFileDSN(path))
		}},
	}
	backends := map[string]envBackend{}
	for _, b := range dbEnvs() {
		backends[b.Name] = b
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.bug != "" {
				t.Skip(tc.bug)
			}
			e := backends[tc.backend].New(t)
			var lot subscriptions.ParkingLot
			var lotDB *gorm.DB
			if tc.lot != nil {
				lot, lotDB = tc.lot(t, e)
			} else {
				lotDB = tc.lotDB(t, e)
				var err error
				lot, err = subscriptions.NewGormParkingLot(lotDB)
				require.NoError(t, err)
			}
			// e.Parking (built on the checkpoint DB) has created parked_events
			// there too, so a write through the foreign transaction would
			// succeed silently instead of failing.
			before, poison, after := parkFeed(t, e, 1, 1)
			probe := newParkProbe()
			h := parkHandler(e, probe, func(ev domain.EventEnvelope[any], _ int) error {
				if ev.ID == poison.ID {
					return errors.New("park: poison refused")
				}
				return nil
			})
			sub := parkSubscriber(t, e, "park-foreign", h, subscriptions.WithMaxRetries(1), subscriptions.WithParkingLot(lot))
			r := start(t, sub)
			parked := parkWaitParked(t, sub, 1)
			waitCaughtUp(t, sub)
			r.stop(t)

			require.Equal(t, poison.ID, parked[0].EventID)
			var inLot int64
			require.NoError(t, lotDB.Raw("SELECT count(*) FROM parked_events WHERE event_id = ?", poison.ID).Scan(&inLot).Error)
			require.EqualValues(t, 1, inLot, "the row is in the lot's database")
			if tc.separate {
				var inCheckpointDB int64
				require.NoError(t, e.DB.Raw("SELECT count(*) FROM parked_events").Scan(&inCheckpointDB).Error)
				require.Zero(t, inCheckpointDB, "the lot wrote through the batch's foreign transaction")
			}
			head, err := e.Events.HeadPosition(context.Background())
			require.NoError(t, err)
			require.Equal(t, head, parkPosition(t, e, "park-foreign"))
			parkRequireProcessed(t, e, probe, parkConcat(before, after))
		})
	}
}

// TestParkingReparkAfterReset parks a poison event, resets the checkpoint
// to 0 and lets it fail again differently: the one entry is updated with
// the new error, attempt count and time. The reset is made through the
// running process's own store (Subscriber.ResetCheckpoint) or, as an
// operator's separate process would, through a second store instance.
func TestParkingReparkAfterReset(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		reset func(t *testing.T, e *env, sub *subscriptions.Subscriber) error
	}{
		{"ResetCheckpoint", func(_ *testing.T, _ *env, sub *subscriptions.Subscriber) error {
			return sub.ResetCheckpoint(context.Background(), 0)
		}},
		{"second store", func(t *testing.T, e *env, sub *subscriptions.Subscriber) error {
			return e.freshCheckpoints(t).Reset(context.Background(), sub.Name(), 0)
		}},
	}
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					if b.Name == "memory" && tc.name == "second store" {
						t.Skip("memory checkpoint stores share no state")
					}
					parkRepark(t, b.New(t), tc.reset)
				})
			}
		})
	}
}

func parkRepark(t *testing.T, e *env, reset func(t *testing.T, e *env, sub *subscriptions.Subscriber) error) {
	_, poison, _ := parkFeed(t, e, 1, 1)
	run := func(generation, maxRetries int, doReset bool) {
		h := func(_ context.Context, ev domain.EventEnvelope[any]) error {
			if ev.ID == poison.ID {
				return fmt.Errorf("park: poison refused (generation %d)", generation)
			}
			return nil
		}
		sub := parkSubscriber(t, e, "park-repark", h, subscriptions.WithMaxRetries(maxRetries), subscriptions.WithParkingLot(e.Parking))
		if doReset {
			require.NoError(t, reset(t, e, sub))
			require.Zero(t, parkPosition(t, e, "park-repark"))
		}
		r := start(t, sub)
		require.Eventually(t, func() bool {
			p, err := sub.ListParked(context.Background())
			return err == nil && len(p) == 1 && p[0].Attempts == 1+maxRetries
		}, 30*time.Second, 5*time.Millisecond, "generation %d was not parked", generation)
		waitCaughtUp(t, sub)
		r.stop(t)
	}
	run(1, 1, false)
	first, err := e.Parking.List(context.Background(), "park-repark")
	require.NoError(t, err)
	require.Len(t, first, 1)
	require.Equal(t, 2, first[0].Attempts)
	require.Contains(t, first[0].Error, "generation 1")

	run(2, 3, true)
	second, err := e.Parking.List(context.Background(), "park-repark")
	require.NoError(t, err)
	require.Len(t, second, 1, "re-parking must update the entry, not add one")
	got := second[0]
	require.Equal(t, poison.ID, got.EventID)
	require.Equal(t, poison.Position, got.Position)
	require.Equal(t, poison.EventType, got.EventType)
	require.Equal(t, 4, got.Attempts, "attempts updated")
	require.Contains(t, got.Error, "generation 2", "error updated")
	require.NotContains(t, got.Error, "generation 1")
	require.True(t, got.ParkedAt.After(first[0].ParkedAt), "parked_at updated: %v then %v", first[0].ParkedAt, got.ParkedAt)
}

// TestParkingWithoutLot checks that ListParked and ReplayParked on a
// subscriber without a parking lot fail naming the subscriber and wrapping
// ErrNoParkingLot.
func TestParkingWithoutLot(t *testing.T) {
	t.Parallel()
	e := envBackends()[0].New(t)
	ids := appendN(t, e.Events, "park.ok", 0, 1)
	const name = "park-no-lot"
	sub := parkSubscriber(t, e, name, func(context.Context, domain.EventEnvelope[any]) error { return nil })
	cases := []struct {
		name string
		call func() error
	}{
		{"ListParked", func() error { _, err := sub.ListParked(context.Background()); return err }},
		{"ReplayParked/stored event", func() error { return sub.ReplayParked(context.Background(), ids[0]) }},
		{"ReplayParked/unknown event", func() error { return sub.ReplayParked(context.Background(), "no-such-event") }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			require.ErrorIs(t, err, subscriptions.ErrNoParkingLot)
			require.Contains(t, err.Error(), name)
		})
	}
}
