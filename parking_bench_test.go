package subscriptions_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// BenchmarkParkedPaging reads a lot of 20,000 parked events (one
// subscriber, plus as many for another) the way the admin page and the
// CLI do, one page of 100 from a cursor in the middle, beside the
// baseline of ListParked reading the whole list, on every database.
func BenchmarkParkedPaging(b *testing.B) {
	const n = 20000
	ctx := context.Background()
	for _, be := range dbtest.GormBackends() {
		b.Run(be.Name, func(b *testing.B) {
			db := be.Open(b)
			lot, err := subscriptions.NewGormParkingLot(db)
			require.NoError(b, err)
			// Bulk insert: parking 40,000 events one by one would dominate.
			for _, sub := range []string{"bench-parked", "bench-other"} {
				for start := 0; start < n; start += 500 {
					require.NoError(b, db.Transaction(func(tx *gorm.DB) error {
						tctx := subscriptions.WithLotTxForTest(ctx, tx, lot)
						for i := start; i < start+500; i++ {
							p := subscriptions.ParkedEvent{Subscriber: sub, EventID: fmt.Sprintf("ev-%06d", i), EventType: "bench",
								Position: int64(i + 1), Error: "bench", Attempts: 1, AggregateID: fmt.Sprintf("agg-%d", i%50)}
							if err := lot.Park(tctx, p); err != nil {
								return err
							}
						}
						return nil
					}))
				}
			}
			// Statistics, as autovacuum would gather them: without them
			// Postgres sorts the 10,000 rows past the cursor (~15 ms a page)
			// instead of walking the (subscriber_key, position) index.
			require.NoError(b, db.Exec("ANALYZE parked_events").Error)
			b.Run("page of 100", func(b *testing.B) {
				for b.Loop() {
					got, err := lot.ListFiltered(ctx, "bench-parked", subscriptions.ParkedFilter{AfterPosition: n / 2, Limit: 100})
					require.NoError(b, err)
					require.Len(b, got, 100)
				}
			})
			b.Run("page of 100 of one aggregate", func(b *testing.B) {
				for b.Loop() {
					got, err := lot.ListFiltered(ctx, "bench-parked", subscriptions.ParkedFilter{AggregateID: "agg-7", AfterPosition: n / 2, Limit: 100})
					require.NoError(b, err)
					require.Len(b, got, 100)
				}
			})
			b.Run("baseline: the whole list", func(b *testing.B) {
				for b.Loop() {
					got, err := lot.List(ctx, "bench-parked")
					require.NoError(b, err)
					require.Len(b, got, n)
				}
			})
		})
	}
}
