package pgxstore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// sharedLots is the table of one schema behind a pgx lot and a GORM lot,
// each on its own pool, as two processes of a rolling switch have it.
type sharedLots struct {
	pgx  *pgxstore.ParkingLot
	gorm *subscriptions.GormParkingLot
	pg   *dbtest.Postgres
}

func newSharedLots(t *testing.T) sharedLots {
	t.Helper()
	lot, pg, _ := newLot(t)
	g, err := subscriptions.NewGormParkingLot(pg.Open(t))
	require.NoError(t, err)
	return sharedLots{pgx: lot, gorm: g, pg: pg}
}

// lots returns the lot that parks and the other, which reads: the pgx
// lot parks when pgxParks.
func (s sharedLots) lots(pgxParks bool) (parks, reads subscriptions.ManagedParkingLot) {
	if pgxParks {
		return s.pgx, s.gorm
	}
	return s.gorm, s.pgx
}

// requireSameView: both lots list, filter, get and count the subscriber's
// entries as identical ParkedEvent values.
func (s sharedLots) requireSameView(t *testing.T, subscriber string, want int) []subscriptions.ParkedEvent {
	t.Helper()
	ctx := testCtx(t)
	viaPgx, err := s.pgx.List(ctx, subscriber)
	require.NoError(t, err)
	viaGorm, err := s.gorm.List(ctx, subscriber)
	require.NoError(t, err)
	require.Equal(t, viaGorm, viaPgx, "List of %q", subscriber)
	require.Len(t, viaPgx, want)
	f := subscriptions.ParkedFilter{AfterPosition: 1, Limit: 2}
	pagePgx, err := s.pgx.ListFiltered(ctx, subscriber, f)
	require.NoError(t, err)
	pageGorm, err := s.gorm.ListFiltered(ctx, subscriber, f)
	require.NoError(t, err)
	require.Equal(t, pageGorm, pagePgx, "ListFiltered of %q", subscriber)
	for _, p := range viaPgx {
		a, err := s.pgx.Get(ctx, subscriber, p.EventID)
		require.NoError(t, err)
		b, err := s.gorm.Get(ctx, subscriber, p.EventID)
		require.NoError(t, err)
		require.Equal(t, p, a)
		require.Equal(t, b, a)
	}
	n, err := s.pgx.CountParked(ctx, subscriber)
	require.NoError(t, err)
	m, err := s.gorm.CountParked(ctx, subscriber)
	require.NoError(t, err)
	require.Equal(t, want, n)
	require.Equal(t, want, m)
	return viaPgx
}

// TestParkingLotSharesTheGormTable: rows either lot parks, the other
// lists, gets, counts, re-parks, records failures on, replays and
// discards, with identical ParkedEvent values; names that only the key
// digests can index are found exactly by both.
func TestParkingLotSharesTheGormTable(t *testing.T) {
	t.Parallel()
	for name, pgxParks := range map[string]bool{"pgx parks, gorm reads": true, "gorm parks, pgx reads": false} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := newSharedLots(t)
			lot, other := s.lots(pgxParks)
			ctx := testCtx(t)
			sub := `mixed'"` + strings.Repeat("ü", (subscriptions.MaxSubscriberNameBytes-7)/2) // hostile, near the bound
			at := time.Date(2025, 6, 7, 8, 9, 10, 123456000, time.FixedZone("x", 3600))
			var parked []subscriptions.ParkedEvent
			for i, id := range []string{"ev-1", "ev'2; --", strings.Repeat("e", 2048)} {
				p := subscriptions.ParkedEvent{Subscriber: sub, EventID: id, EventType: "mixed.type", Position: int64(i + 1),
					Error: "failed \xff with a NUL \x00", Attempts: 3 + i, ParkedAt: at.Add(time.Duration(i) * time.Second),
					AggregateID: "agg-" + id}
				require.NoError(t, lot.Park(ctx, p))
				parked = append(parked, p)
			}
			got := s.requireSameView(t, sub, 3)
			for i, p := range parked {
				require.Equal(t, p.EventID, got[i].EventID)
				require.True(t, p.ParkedAt.Equal(got[i].ParkedAt))
				require.Equal(t, time.UTC, got[i].ParkedAt.Location())
				require.Equal(t, "failed \uFFFD with a NUL ", got[i].Error, "both lots store text alike")
			}

			// Re-parking through the other lot updates the same row.
			again := parked[0]
			again.Error, again.Attempts = "again", 9
			require.NoError(t, other.Park(ctx, again))
			got = s.requireSameView(t, sub, 3)
			require.Equal(t, "again", got[0].Error)
			require.Equal(t, 9, got[0].Attempts)

			// A failed replay recorded through the other lot.
			failedAt := time.Date(2025, 6, 8, 0, 0, 0, 0, time.UTC)
			require.NoError(t, other.RecordReplayFailure(ctx, sub, parked[1].EventID, "replay failed", failedAt))
			got = s.requireSameView(t, sub, 3)
			require.Equal(t, parked[1].Attempts+1, got[1].Attempts)
			require.Equal(t, failedAt, got[1].ParkedAt)

			// Replayed by the other lot, its transaction handed to the handler.
			var ran int
			require.NoError(t, other.Replay(ctx, sub, parked[1].EventID, domain.EventEnvelope[any]{ID: parked[1].EventID},
				func(hctx context.Context, _ domain.EventEnvelope[any]) error {
					ran++
					if !pgxParks {
						require.True(t, inPgxTx(hctx), "the pgx lot hands its transaction through pgxstore.TxFromContext")
					} else {
						require.NotNil(t, subscriptions.TxFromContext(hctx))
					}
					return nil
				}))
			require.Equal(t, 1, ran)
			s.requireSameView(t, sub, 2)

			// Discarded by the other lot: the entry as it was.
			before, err := lot.Get(ctx, sub, parked[2].EventID)
			require.NoError(t, err)
			discarded, err := other.Discard(ctx, sub, parked[2].EventID)
			require.NoError(t, err)
			require.Equal(t, before, discarded)
			s.requireSameView(t, sub, 1)
			_, err = lot.Discard(ctx, sub, parked[2].EventID)
			require.ErrorIs(t, err, subscriptions.ErrEventNotParked)

			// Purged by the other lot.
			require.NoError(t, other.(subscriptions.ParkingLotPurger).Purge(ctx, sub))
			s.requireSameView(t, sub, 0)
		})
	}
}

// TestParkingLotTakesOverOriginalDatabase: on a database the original
// module created and filled (its GORM AutoMigrate layout: no key columns,
// nullable columns), pgx lots starting at once with a GORM lot migrate it
// in place; the original's parked event is listed by both as the same
// value, a row the original's model writes afterwards (and one with the
// NULLs its layout allows) is read alike, and pgx replays and discards
// them.
func TestParkingLotTakesOverOriginalDatabase(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pg := dbtest.NewPostgres(t)
	orig := dbtest.CreateOriginalSchema(t, pg.DB, true)

	const processes = 3
	var wg sync.WaitGroup
	errs := make(chan error, processes+1)
	lots := make([]*pgxstore.ParkingLot, processes)
	for i := range processes {
		pool := pg.OpenPgx(t)
		wg.Go(func() {
			var err error
			lots[i], err = pgxstore.NewParkingLot(ctx, pool)
			errs <- err
		})
	}
	gormDB := pg.Open(t)
	var gormLot *subscriptions.GormParkingLot
	wg.Go(func() {
		var err error
		gormLot, err = subscriptions.NewGormParkingLot(gormDB)
		errs <- err
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err, "a constructor on the original's database")
	}
	s := sharedLots{pgx: lots[0], gorm: gormLot, pg: pg}

	got := s.requireSameView(t, orig.Subscriber, 1)
	require.Equal(t, subscriptions.ParkedEvent{Subscriber: orig.Subscriber, EventID: orig.ParkedID, EventType: "original.happened",
		Position: 2, Error: "original failure", Attempts: 6, ParkedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}, got[0])

	// Rows written as the original writes them, after the takeover: through
	// its model, and with the NULLs its layout allows.
	require.NoError(t, pg.DB.Create(&dbtest.OriginalParkedEvent{Subscriber: orig.Subscriber, EventID: orig.EventIDs[3],
		EventType: "original.happened", Position: 4, Error: "via the model", Attempts: 1,
		ParkedAt: time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)}).Error)
	require.NoError(t, pg.DB.Exec(`INSERT INTO parked_events (subscriber, event_id, position) VALUES (?, ?, 5)`,
		orig.Subscriber, orig.EventIDs[4]).Error)
	got = s.requireSameView(t, orig.Subscriber, 3)
	require.Equal(t, subscriptions.ParkedEvent{Subscriber: orig.Subscriber, EventID: orig.EventIDs[4], Position: 5}, got[2],
		"NULL columns read as zero values")

	for _, id := range []string{orig.ParkedID, orig.EventIDs[3]} {
		var ran []string
		require.NoError(t, lots[1].Replay(ctx, orig.Subscriber, id, domain.EventEnvelope[any]{ID: id},
			func(_ context.Context, ev domain.EventEnvelope[any]) error {
				ran = append(ran, ev.ID)
				return nil
			}))
		require.Equal(t, []string{id}, ran)
	}
	discarded, err := lots[2].Discard(ctx, orig.Subscriber, orig.EventIDs[4])
	require.NoError(t, err)
	require.Equal(t, got[2], discarded)
	s.requireSameView(t, orig.Subscriber, 0)
}

// TestConcurrentReplaysAcrossLots: replays of one entry started at once
// from pgx and GORM lots (each on its own pool) run the handler once: one
// replay succeeds, every other is refused with ErrReplayInProgress or,
// after the winner committed, ErrEventNotParked.
func TestConcurrentReplaysAcrossLots(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newSharedLots(t)
	otherPgx, err := pgxstore.NewParkingLot(ctx, s.pg.OpenPgx(t))
	require.NoError(t, err)
	replayers := []subscriptions.ParkingLot{s.pgx, s.gorm, otherPgx, s.gorm, s.pgx, otherPgx}

	t.Run("while the winner's handler runs, every other replay is refused", func(t *testing.T) {
		require.NoError(t, s.gorm.Park(ctx, subscriptions.ParkedEvent{Subscriber: "race", EventID: "held", Position: 1}))
		var mu sync.Mutex
		runs := 0
		release := make(chan struct{})
		releaseOnce := sync.OnceFunc(func() { close(release) })
		var wg sync.WaitGroup
		defer wg.Wait()
		defer releaseOnce() // before the wait, when an assertion fails
		handler := func(context.Context, domain.EventEnvelope[any]) error {
			mu.Lock()
			runs++
			mu.Unlock()
			select { // the winner holds the row until every other replay answered
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		results := make(chan error, len(replayers))
		for _, lot := range replayers {
			wg.Go(func() { results <- lot.Replay(ctx, "race", "held", domain.EventEnvelope[any]{ID: "held"}, handler) })
		}
		for range len(replayers) - 1 {
			select {
			case err := <-results:
				require.ErrorIs(t, err, subscriptions.ErrReplayInProgress)
			case <-ctx.Done():
				t.Fatal("a losing replay waited for the winner instead of refusing")
			}
		}
		releaseOnce()
		require.NoError(t, <-results, "the winner")
		wg.Wait()
		require.Equal(t, 1, runs)
		s.requireSameView(t, "race", 0)
	})

	t.Run("rounds of replays started together", func(t *testing.T) {
		for round := range 20 {
			id := "round-" + string(rune('a'+round))
			require.NoError(t, s.pgx.Park(ctx, subscriptions.ParkedEvent{Subscriber: "race", EventID: id, Position: int64(round + 2)}))
			var mu sync.Mutex
			runs := 0
			handler := func(context.Context, domain.EventEnvelope[any]) error {
				mu.Lock()
				defer mu.Unlock()
				runs++
				return nil
			}
			start := make(chan struct{})
			results := make(chan error, len(replayers))
			var wg sync.WaitGroup
			for _, lot := range replayers {
				wg.Go(func() {
					<-start
					results <- lot.Replay(ctx, "race", id, domain.EventEnvelope[any]{ID: id}, handler)
				})
			}
			close(start)
			wg.Wait()
			close(results)
			won := 0
			for err := range results {
				if err == nil {
					won++
					continue
				}
				require.True(t, errors.Is(err, subscriptions.ErrReplayInProgress) || errors.Is(err, subscriptions.ErrEventNotParked),
					"round %d: %v", round, err)
			}
			require.Equal(t, 1, won, "round %d", round)
			require.Equal(t, 1, runs, "round %d: the handler ran more than once", round)
		}
		s.requireSameView(t, "race", 0)
	})
}
