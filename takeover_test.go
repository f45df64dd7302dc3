package subscriptions_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// takeoverDB is a database the original module wrote, reachable through
// new pools as other processes would open it.
type takeoverDB struct {
	name     string
	postgres bool
	pgx      bool // the stores are pgxstore's, on a pgx pool of the same database
	open     func(t *testing.T) *gorm.DB
}

func takeoverDBs() []takeoverDB {
	out := []takeoverDB{{name: "postgres", postgres: true}, {name: "postgres-pgx", postgres: true, pgx: true}}
	for _, d := range dbtest.SQLiteDrivers() {
		out = append(out, takeoverDB{name: "sqlite-file-" + d.Name})
	}
	return out
}

// originalFixture creates the original's schema and fills it as the
// original writes it: events 1..10 (Postgres positions from the
// original's sequence), subscriber "orig-sub" checkpointed at 6, event 4
// parked for it.
func originalFixture(t *testing.T, db *gorm.DB, postgres bool) []string {
	t.Helper()
	dbtest.CreateOriginalSchema(t, db, false)
	var ids []string
	created := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	for i := 1; i <= 10; i++ {
		id := fmt.Sprintf("orig-event-%02d", i)
		agg := fmt.Sprintf("orig-agg-%d", i%2)
		seq := (i + 1) / 2
		payload := fmt.Sprintf(`{"n": %d}`, i)
		if postgres {
			// Positions come from the original's sequence default.
			require.NoError(t, db.Exec(`INSERT INTO events (id, aggregate_id, event_type, sequence_no, transaction_id, payload, metadata, created_at)
				VALUES (?, ?, 'orig.happened', ?, 'orig-tx', ?::jsonb, '{}'::jsonb, ?)`, id, agg, seq, payload, created).Error)
		} else {
			require.NoError(t, db.Create(&dbtest.OriginalEvent{ID: id, AggregateID: agg, EventType: "orig.happened", SequenceNo: seq,
				TransactionID: "orig-tx", Position: int64(i), Payload: []byte(payload), Metadata: []byte(`{}`), CreatedAt: created}).Error)
		}
		ids = append(ids, id)
	}
	require.NoError(t, db.Create(&dbtest.OriginalCheckpoint{Subscriber: "orig-sub", Position: 6, UpdatedAt: created}).Error)
	require.NoError(t, db.Create(&dbtest.OriginalParkedEvent{Subscriber: "orig-sub", EventID: ids[3], EventType: "orig.happened",
		Position: 4, Error: "original failure", Attempts: 6, ParkedAt: created}).Error)
	return ids
}

// takeoverSnapshot reads every row's data the original wrote, for the
// "never drops or rewrites a row" check.
func takeoverSnapshot(t *testing.T, db *gorm.DB) string {
	t.Helper()
	var events []struct {
		ID, AggregateID, EventType, TransactionID, Payload, Metadata string
		SequenceNo                                                   int
		Position                                                     int64
		CreatedAt                                                    time.Time
	}
	require.NoError(t, db.Raw(`SELECT id, aggregate_id, event_type, sequence_no, transaction_id, position,
		CAST(payload AS TEXT) AS payload, CAST(metadata AS TEXT) AS metadata, created_at
		FROM events ORDER BY position`).Scan(&events).Error)
	var cps []dbtest.OriginalCheckpoint
	require.NoError(t, db.Raw("SELECT subscriber, position, updated_at FROM subscriber_checkpoints ORDER BY subscriber").Scan(&cps).Error)
	var parked []dbtest.OriginalParkedEvent
	require.NoError(t, db.Raw(`SELECT subscriber, event_id, event_type, position, error, attempts, parked_at
		FROM parked_events ORDER BY subscriber, event_id`).Scan(&parked).Error)
	require.Len(t, events, 10)
	return fmt.Sprintf("%+v\n%+v\n%+v", events, cps, parked)
}

// TestTakeOverOriginalDatabase: the three constructors open a database
// the original module created and filled, migrating it in place while
// several processes start at once; the stored checkpoint is resumed (no
// event handled again, none skipped), the parked event is listed and
// replayable, new appends continue the feed after the old positions, and a
// row written through the documented model afterwards is one the library
// reads, and a reset of the original's checkpoint row marks the events it
// re-delivers (DeliveryFrom). No row's data is changed by the takeover.
func TestTakeOverOriginalDatabase(t *testing.T) {
	t.Parallel()
	for _, tdb := range takeoverDBs() {
		t.Run(tdb.name, func(t *testing.T) {
			open := tdb.open
			var pg *dbtest.Postgres
			if tdb.postgres {
				pg = dbtest.NewPostgres(t)
				open = func(t *testing.T) *gorm.DB { return pg.Open(t) }
			} else {
				d := dbtest.Mattn
				if strings.HasSuffix(tdb.name, dbtest.Glebarez.Name) {
					d = dbtest.Glebarez
				}
				dsn := d.FileDSN(filepath.Join(t.TempDir(), "original.db"))
				open = func(t *testing.T) *gorm.DB { return d.OpenDSN(t, dsn) }
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			db := open(t)
			ids := originalFixture(t, db, tdb.postgres)
			before := takeoverSnapshot(t, db)

			// Several processes start at once on the original's database.
			const processes = 4
			var wg sync.WaitGroup
			errs := make(chan error, 3*processes)
			// stores opens the three stores through a new pool, as a process
			// would: GORM's, or pgxstore's on a pgx pool.
			stores := func() (domain.EventStore, subscriptions.CheckpointStore, subscriptions.ParkingLot, error) {
				if tdb.pgx {
					pool := pg.OpenPgx(t)
					events, err := pgxstore.NewEventStore(ctx, pool)
					if err != nil {
						return nil, nil, nil, err
					}
					cps, err := pgxstore.NewCheckpointStore(ctx, pool)
					if err != nil {
						return nil, nil, nil, err
					}
					lot, err := pgxstore.NewParkingLot(ctx, pool)
					return events, cps, lot, err
				}
				db := open(t)
				events, err := infrastructure.NewGormEventStore(db)
				if err != nil {
					return nil, nil, nil, err
				}
				cps, err := subscriptions.NewGormCheckpointStore(db)
				if err != nil {
					return nil, nil, nil, err
				}
				lot, err := subscriptions.NewGormParkingLot(db)
				return events, cps, lot, err
			}
			for range processes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, _, _, err := stores()
					errs <- err
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err, "a constructor on the original's database")
			}
			store, cps, lot, err := stores()
			require.NoError(t, err, "the takeover is idempotent")
			require.Equal(t, before, takeoverSnapshot(t, db), "the takeover changed the original's rows")

			var mu sync.Mutex
			var handled []string
			last := map[string]subscriptions.Delivery{}
			handler := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
				mu.Lock()
				defer mu.Unlock()
				handled = append(handled, ev.ID)
				last[ev.ID] = subscriptions.DeliveryFrom(ctx)
				return nil
			}
			handledIDs := func() []string {
				mu.Lock()
				defer mu.Unlock()
				return append([]string(nil), handled...)
			}
			sub, err := subscriptions.NewSubscriber("orig-sub", store, cps, handler,
				subscriptions.WithParkingLot(lot), subscriptions.WithPollInterval(10*time.Millisecond))
			require.NoError(t, err)

			parked, err := sub.ListParked(ctx)
			require.NoError(t, err)
			require.Len(t, parked, 1)
			require.Equal(t, subscriptions.ParkedEvent{Subscriber: "orig-sub", EventID: ids[3], EventType: "orig.happened",
				Position: 4, Error: "original failure", Attempts: 6, ParkedAt: time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)}, parked[0])

			// The stored checkpoint is resumed: events 7..10, once each.
			r := start(t, sub)
			waitCaughtUp(t, sub)
			require.Equal(t, ids[6:], handledIDs())

			// New appends continue the feed after the old positions.
			for i := 1; i <= 3; i++ {
				ev := domain.NewEventEnvelope[any](map[string]any{"new": i}, "orig-agg-0", "orig.new", 5+i)
				require.NoError(t, store.Append(ctx, "orig-agg-0", 4+i, ev))
			}
			feed, err := store.ReadAfter(ctx, 0, 0)
			require.NoError(t, err)
			require.Len(t, feed, 13)
			for i, ev := range feed {
				require.EqualValues(t, i+1, ev.Position, "feed position %d", i)
				if i < 10 {
					require.Equal(t, ids[i], ev.ID)
					require.Equal(t, map[string]any{"n": float64(i + 1)}, ev.Payload)
				}
			}
			waitCaughtUp(t, sub)
			r.stop(t)
			want := append(append([]string(nil), ids[6:]...), feed[10].ID, feed[11].ID, feed[12].ID)
			require.Equal(t, want, handledIDs(), "every event after the original's checkpoint once, in order")

			// The original's parked event is replayable.
			require.NoError(t, sub.ReplayParked(ctx, ids[3]))
			require.Equal(t, ids[3], handledIDs()[len(want)])
			parked, err = sub.ListParked(ctx)
			require.NoError(t, err)
			require.Empty(t, parked)

			// A row written through the documented model after the takeover is
			// complete: listed, and replayable.
			require.NoError(t, db.Create(&dbtest.OriginalParkedEvent{Subscriber: "orig-sub", EventID: ids[1], EventType: "orig.happened",
				Position: 2, Error: "written through the model", Attempts: 1, ParkedAt: time.Now()}).Error)
			parked, err = sub.ListParked(ctx)
			require.NoError(t, err)
			require.Len(t, parked, 1)
			require.Equal(t, ids[1], parked[0].EventID)
			require.NoError(t, sub.ReplayParked(ctx, ids[1]))

			// The long-identifier safety holds on the taken-over table.
			long := strings.Repeat("s", subscriptions.MaxSubscriberNameBytes)
			longID := strings.Repeat("e", subscriptions.MaxSubscriberNameBytes)
			require.NoError(t, lot.Park(ctx, subscriptions.ParkedEvent{Subscriber: long, EventID: longID, Position: 1, Error: "long", Attempts: 1}))
			longParked, err := lot.List(ctx, long)
			require.NoError(t, err)
			require.Len(t, longParked, 1)
			require.Equal(t, longID, longParked[0].EventID)

			// The original's checkpoint row takes the delivery marks: after
			// a reset back to where the original stood, what came since is
			// re-delivered, and said so.
			require.NoError(t, sub.ResetCheckpoint(ctx, 6))
			r = start(t, sub)
			waitCaughtUp(t, sub)
			r.stop(t)
			mu.Lock()
			defer mu.Unlock()
			for _, ev := range feed[6:] {
				require.Equal(t, subscriptions.Delivery{Kind: subscriptions.DeliveryRedelivery, Through: 13}, last[ev.ID], "event at %d", ev.Position)
			}
		})
	}
}

// TestParkedModelRowIsReadByTheLibrary: on a table the library created, a
// row written through the documented model (subscriptions.
// dbtest.OriginalParkedEvent, which has no key columns) is complete: listed,
// re-parked and replayed like one the library parked; on pgx, by
// pgxstore's lot on the same table.
func TestParkedModelRowIsReadByTheLibrary(t *testing.T) {
	t.Parallel()
	for _, b := range dbEnvs() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ctx := context.Background()
			appendN(t, e.Events, "model.row", 0, 2)
			feed := coreFeed(t, e.Events)
			at := time.Date(2025, 5, 1, 0, 0, 0, 0, time.UTC)
			require.NoError(t, e.DB.Create(&subscriptions.GormParkedEventModel{Subscriber: "model-sub", EventID: feed[1].ID,
				EventType: feed[1].EventType, Position: feed[1].Position, Error: "via the model", Attempts: 3, ParkedAt: at}).Error)
			var replayed []string
			sub, err := subscriptions.NewSubscriber("model-sub", e.Events, e.Checkpoints, func(_ context.Context, ev domain.EventEnvelope[any]) error {
				replayed = append(replayed, ev.ID)
				return nil
			}, subscriptions.WithParkingLot(e.Parking))
			require.NoError(t, err)
			parked, err := sub.ListParked(ctx)
			require.NoError(t, err)
			require.Equal(t, []subscriptions.ParkedEvent{{Subscriber: "model-sub", EventID: feed[1].ID, EventType: feed[1].EventType,
				Position: feed[1].Position, Error: "via the model", Attempts: 3, ParkedAt: at}}, parked)
			// As parking does: the checkpoint is past the parked event.
			require.NoError(t, e.Checkpoints.Reset(ctx, "model-sub", feed[1].Position))
			require.NoError(t, e.Parking.Park(ctx, subscriptions.ParkedEvent{Subscriber: "model-sub", EventID: feed[1].ID,
				EventType: feed[1].EventType, Position: feed[1].Position, Error: "again", Attempts: 4}))
			parked, err = sub.ListParked(ctx)
			require.NoError(t, err)
			require.Len(t, parked, 1, "re-parking updates the model's row")
			require.Equal(t, "again", parked[0].Error)
			require.NoError(t, sub.ReplayParked(ctx, feed[1].ID))
			require.Equal(t, []string{feed[1].ID}, replayed)
			parked, err = sub.ListParked(ctx)
			require.NoError(t, err)
			require.Empty(t, parked)
		})
	}
}
