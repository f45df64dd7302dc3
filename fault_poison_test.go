package subscriptions_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestFaultPoisonStorm feeds a subscriber with a GormParkingLot (on the
// same database as its checkpoints and projection) a stream in which 1% of
// the events fail permanently and 5% fail on their first attempt only; the
// handler writes its projection row before it fails, so every failed
// attempt has something to discard. Every permanent failure is parked
// exactly once (one Park call, the right position, all its attempts),
// every other event is projected exactly once, and replaying the parked
// events after the handler is fixed projects them and empties the lot.
func TestFaultPoisonStorm(t *testing.T) {
	t.Parallel()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		pg := dbtest.NewPostgres(t)
		faultPoisonStorm(t, gormEnv(t, "postgres", pg.DB, pg))
	})
	t.Run("pgx", func(t *testing.T) {
		t.Parallel()
		faultPoisonStorm(t, pgxEnv(t))
	})
	t.Run("sqlite-file", func(t *testing.T) {
		t.Parallel()
		db := dbtest.OpenSQLite(t, dbtest.SQLiteFileDSN(filepath.Join(t.TempDir(), "poison.db")))
		faultPoisonStorm(t, gormEnv(t, "sqlite-file", db, nil))
	})
}

type faultKind int

const (
	faultOK faultKind = iota
	faultPermanent
	faultTransient
)

// faultKindOf is the storm's mix: 1% permanent, 5% transient (disjoint).
func faultKindOf(i int) faultKind {
	switch {
	case i%100 == 42:
		return faultPermanent
	case i%20 == 7:
		return faultTransient
	}
	return faultOK
}

func faultPoisonStorm(t *testing.T, e *env) {
	const (
		name       = "fault-poison"
		table      = "fault_poison_proj"
		maxRetries = 2
	)
	db, store, cps := e.DB, e.Events, e.Checkpoints
	lot := &faultCountingLot{ParkingLot: e.Parking, parks: map[string]int{}}
	createProjection(t, db, table)

	var (
		kinds    sync.Map // event ID -> faultKind
		attempts sync.Map // event ID -> *atomic.Int32
		fixed    atomic.Bool
		firstErr atomic.Int64 // transient first attempts that failed
	)
	handler := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		if err := e.project(ctx, table, ev); err != nil {
			return err
		}
		counter, _ := attempts.LoadOrStore(ev.ID, new(atomic.Int32))
		attempt := counter.(*atomic.Int32).Add(1)
		kind, _ := kinds.Load(ev.ID)
		switch kind {
		case faultPermanent:
			if !fixed.Load() {
				return fmt.Errorf("permanent failure of %s", ev.ID)
			}
		case faultTransient:
			if attempt == 1 {
				firstErr.Add(1)
				return errors.New("transient failure")
			}
		}
		return nil
	}
	sub, err := subscriptions.NewSubscriber(name, store, cps, handler,
		subscriptions.WithParkingLot(lot), subscriptions.WithMaxRetries(maxRetries),
		subscriptions.WithRetryBackoff(time.Millisecond, 2*time.Millisecond),
		subscriptions.WithBatchSize(25), subscriptions.WithPollInterval(20*time.Millisecond),
		subscriptions.WithLogger(quietLogger()))
	require.NoError(t, err)

	n := faultScale(400, 5000)
	var permanent, transient []string
	appendRange := func(from, to int) {
		const chunk = 10
		for i := from; i < to; i += chunk {
			agg := fmt.Sprintf("poison-agg-%d", (i/chunk)%4)
			batch := make([]domain.EventEnvelope[any], 0, chunk)
			for j := i; j < min(i+chunk, to); j++ {
				ev := domain.NewEventEnvelope[any](map[string]any{"n": j}, agg, "fault.poison", 0)
				kind := faultKindOf(j)
				kinds.Store(ev.ID, kind)
				switch kind {
				case faultPermanent:
					permanent = append(permanent, ev.ID)
				case faultTransient:
					transient = append(transient, ev.ID)
				}
				batch = append(batch, ev)
			}
			require.NoError(t, store.Append(context.Background(), agg, -1, batch...))
		}
	}
	// Half before the subscriber starts (a catch-up), half while it runs.
	appendRange(0, n/2)
	run := start(t, sub)
	appendRange(n/2, n)
	require.Eventually(t, func() bool {
		lag, err := sub.Lag(context.Background())
		return err == nil && lag == 0
	}, 2*time.Minute, 10*time.Millisecond, "the subscriber did not get through the storm")
	run.stop(t)

	feed := faultFeedIDs(t, store)
	require.Len(t, feed, n)
	isPermanent := map[string]bool{}
	for _, id := range permanent {
		isPermanent[id] = true
	}
	var others []string
	for _, id := range feed {
		if !isPermanent[id] {
			others = append(others, id)
		}
	}
	require.NotEmpty(t, permanent)
	require.NotEmpty(t, transient)
	require.EqualValues(t, len(transient), firstErr.Load(), "every transient event fails its first attempt")

	// Parked: exactly the permanent failures, each once, with its position
	// and every attempt.
	parked, err := sub.ListParked(context.Background())
	require.NoError(t, err)
	parkedIDs := make([]string, len(parked))
	for i, p := range parked {
		parkedIDs[i] = p.EventID
		require.Equal(t, name, p.Subscriber)
		require.Equal(t, "fault.poison", p.EventType)
		require.Equal(t, 1+maxRetries, p.Attempts, "attempts of %s", p.EventID)
		require.Contains(t, p.Error, "permanent failure of "+p.EventID)
		ev, err := store.GetEventByID(context.Background(), p.EventID)
		require.NoError(t, err)
		require.Equal(t, ev.Position, p.Position)
	}
	faultRequireExactlyOnce(t, "parked", parkedIDs, permanent)
	for _, id := range permanent {
		require.Equal(t, 1, lot.count(id), "Park calls for %s", id)
	}
	require.Equal(t, len(permanent), lot.total(), "Park calls in all")
	faultRequireExactlyOnce(t, "projected before the replay", projected(t, db, table), others)
	for _, id := range transient {
		counter, _ := attempts.Load(id)
		require.GreaterOrEqual(t, counter.(*atomic.Int32).Load(), int32(2), "transient event %s was retried", id)
	}

	// The fix, then the replay.
	fixed.Store(true)
	for _, id := range parkedIDs {
		require.NoError(t, sub.ReplayParked(context.Background(), id))
	}
	left, err := sub.ListParked(context.Background())
	require.NoError(t, err)
	require.Empty(t, left, "the parking lot is not empty after replaying everything")
	err = sub.ReplayParked(context.Background(), parkedIDs[0])
	require.ErrorIs(t, err, subscriptions.ErrEventNotParked)
	faultRequireExactlyOnce(t, "projected after the replay", projected(t, db, table), feed)
	require.Equal(t, faultHead(t, store), faultCheckpoint(t, db, name))
	require.Equal(t, len(permanent), lot.total(), "replaying parked nothing new")
	t.Logf("poison storm on %s: %d events, %d parked and replayed, %d transient failures retried", e.Name, n, len(permanent), len(transient))
}

// faultCountingLot counts Park calls per event ID on top of a real lot.
// It passes the context through untouched, so the real lot still joins
// the batch transaction.
type faultCountingLot struct {
	subscriptions.ParkingLot
	mu    sync.Mutex
	parks map[string]int
}

func (l *faultCountingLot) Park(ctx context.Context, p subscriptions.ParkedEvent) error {
	err := l.ParkingLot.Park(ctx, p)
	if err == nil {
		l.mu.Lock()
		l.parks[p.EventID]++
		l.mu.Unlock()
	}
	return err
}

func (l *faultCountingLot) count(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.parks[id]
}

func (l *faultCountingLot) total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.parks {
		n += c
	}
	return n
}
