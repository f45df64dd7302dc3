package subscriptions_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// TestGormParkingLotAddsAggregateColumn: a parked_events table created
// before aggregate_id existed gets the column from NewGormParkingLot; its
// rows read back with an empty aggregate and new parks store one.
func TestGormParkingLotAddsAggregateColumn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range dbtest.GormBackends() {
		t.Run(b.Name, func(t *testing.T) {
			db := b.Open(t)
			// The table as earlier versions created it, with one row.
			if b.Postgres {
				require.NoError(t, db.Exec(`CREATE TABLE parked_events (
					key bytea NOT NULL PRIMARY KEY, subscriber_key bytea NOT NULL, subscriber text NOT NULL,
					event_id text NOT NULL, event_type text NOT NULL DEFAULT '', position bigint NOT NULL DEFAULT 0,
					error text NOT NULL DEFAULT '', attempts integer NOT NULL DEFAULT 0, parked_at timestamptz)`).Error)
				require.NoError(t, db.Exec(`CREATE INDEX idx_parked_events_position ON parked_events (subscriber_key, position)`).Error)
				require.NoError(t, db.Exec(`INSERT INTO parked_events VALUES (sha256('any key'::bytea), sha256('old'::bytea), 'old', 'ev-old', 't', 1, 'e', 2, now())`).Error)
			} else {
				require.NoError(t, db.Exec(`CREATE TABLE parked_events (subscriber text NOT NULL, event_id text NOT NULL,
					event_type text NOT NULL DEFAULT '', position integer NOT NULL DEFAULT 0, error text NOT NULL DEFAULT '',
					attempts integer NOT NULL DEFAULT 0, parked_at datetime, PRIMARY KEY (subscriber, event_id))`).Error)
				require.NoError(t, db.Exec(`CREATE INDEX idx_parked_events_position ON parked_events (subscriber, position)`).Error)
				require.NoError(t, db.Exec(`INSERT INTO parked_events VALUES ('old', 'ev-old', 't', 1, 'e', 2, CURRENT_TIMESTAMP)`).Error)
			}
			lot, err := subscriptions.NewGormParkingLot(db)
			require.NoError(t, err)
			_, err = subscriptions.NewGormParkingLot(db)
			require.NoError(t, err, "a second constructor finds the column there")

			got, err := lot.List(ctx, "old")
			require.NoError(t, err)
			require.Len(t, got, 1)
			require.Equal(t, "ev-old", got[0].EventID)
			require.Empty(t, got[0].AggregateID)

			require.NoError(t, lot.Park(ctx, subscriptions.ParkedEvent{Subscriber: "old", EventID: "ev-new", Position: 2, AggregateID: "acc-9"}))
			page, err := lot.ListFiltered(ctx, "old", subscriptions.ParkedFilter{AggregateID: "acc-9"})
			require.NoError(t, err)
			require.Len(t, page, 1)
			require.Equal(t, "ev-new", page[0].EventID)
		})
	}
}
