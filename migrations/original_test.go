package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/migrations"
)

// TestGooseTakesOverAnOriginalDatabase: a database the original module
// created and filled (its AutoMigrate tables, its rows) fails Verify,
// takes the files from goose, then passes it, with every row kept. The
// verify-only constructors then carry on where the original left off: the
// subscriber resumes after its stored checkpoint (nothing handled again,
// nothing skipped), new appends continue the feed after the old
// positions, the parked event is listed and replayable, and a row written
// through the documented model is one the library reads.
func TestGooseTakesOverAnOriginalDatabase(t *testing.T) {
	for _, b := range dbtest.GormBackends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := testCtx(t)
			db := b.Open(t)
			orig := dbtest.CreateOriginalSchema(t, db, true)
			err := migrations.Verify(ctx, db)
			require.ErrorIs(t, err, migrations.ErrSchemaMismatch)
			require.ErrorContains(t, err, "missing table "+migrations.VersionTable)
			if b.Postgres {
				require.ErrorContains(t, err, "missing column parked_events.key (added by postgres/00001_create_tables.up.sql)")
				require.ErrorContains(t, err, "missing trigger parked_events_keys on parked_events")
			}

			require.Equal(t, fileCount(t, db.Name()), dbtest.ApplyWithGoose(t, db))
			require.NoError(t, migrations.Verify(ctx, db))

			events, err := infrastructure.NewGormEventStore(db, infrastructure.WithSchemaVerifyOnly())
			require.NoError(t, err)
			cps, err := subscriptions.NewGormCheckpointStore(db, subscriptions.WithSchemaVerifyOnly())
			require.NoError(t, err)
			lot, err := subscriptions.NewGormParkingLot(db, subscriptions.WithSchemaVerifyOnly())
			require.NoError(t, err)

			feed, err := events.ReadAfter(ctx, 0, 0)
			require.NoError(t, err)
			require.Len(t, feed, len(orig.EventIDs), "every original event kept")
			for i, ev := range feed {
				require.Equal(t, orig.EventIDs[i], ev.ID)
				require.EqualValues(t, i+1, ev.Position)
				require.Equal(t, map[string]any{"n": float64(i + 1)}, ev.Payload)
			}
			fresh := domain.NewEventEnvelope[any](map[string]any{"n": 6}, "original-agg", "original.happened", 0)
			require.NoError(t, events.Append(ctx, "original-agg", 5, fresh))
			got, err := events.GetEventByID(ctx, fresh.ID)
			require.NoError(t, err)
			require.EqualValues(t, 6, got.Position, "the feed continues after the old positions")
			require.Equal(t, 6, got.SequenceNo)

			var handled []string
			sub, err := subscriptions.NewSubscriber(orig.Subscriber, events, cps, func(ctx context.Context, ev domain.EventEnvelope[any]) error {
				handled = append(handled, ev.ID)
				return nil
			}, subscriptions.WithParkingLot(lot), subscriptions.WithPollInterval(10*time.Millisecond), subscriptions.WithLogger(quietLogger()))
			require.NoError(t, err)
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- sub.Run(runCtx) }()
			require.Eventually(t, func() bool {
				lag, err := sub.Lag(ctx)
				return err == nil && lag == 0
			}, 30*time.Second, 5*time.Millisecond)
			stop()
			require.NoError(t, <-done)
			require.Equal(t, []string{orig.EventIDs[3], orig.EventIDs[4], fresh.ID}, handled, "resumed after the stored checkpoint")

			parked, err := sub.ListParked(ctx)
			require.NoError(t, err)
			require.Len(t, parked, 1)
			require.Equal(t, orig.ParkedID, parked[0].EventID)
			require.Equal(t, "original failure", parked[0].Error)

			// A row written through the documented model is read back.
			require.NoError(t, db.Create(&subscriptions.GormParkedEventModel{Subscriber: orig.Subscriber, EventID: orig.EventIDs[0],
				EventType: "original.happened", Position: 1, Error: "written through the model", Attempts: 1, ParkedAt: time.Now().UTC()}).Error)
			parked, err = sub.ListParked(ctx)
			require.NoError(t, err)
			require.Len(t, parked, 2)
			require.Equal(t, orig.EventIDs[0], parked[0].EventID)

			handled = nil
			require.NoError(t, sub.ReplayParked(ctx, orig.ParkedID))
			require.NoError(t, sub.ReplayParked(ctx, orig.EventIDs[0]))
			require.Equal(t, []string{orig.ParkedID, orig.EventIDs[0]}, handled)
			parked, err = sub.ListParked(ctx)
			require.NoError(t, err)
			require.Empty(t, parked)
		})
	}
}
