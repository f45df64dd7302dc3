package subscriptions_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

func TestSmokeProjection(t *testing.T) {
	for _, b := range dbtest.GormBackends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			db := b.Open(t)
			store, err := infrastructure.NewGormEventStore(db)
			require.NoError(t, err)
			cps, err := subscriptions.NewGormCheckpointStore(db)
			require.NoError(t, err)
			lot, err := subscriptions.NewGormParkingLot(db)
			require.NoError(t, err)
			require.NoError(t, db.Exec("CREATE TABLE proj (event_id text PRIMARY KEY)").Error)
			for i := 0; i < 25; i++ {
				require.NoError(t, store.Append(ctx, fmt.Sprintf("agg-%d", i%3), -1, domain.NewEventEnvelope[any](map[string]any{"i": i}, "", "thing.happened", 0)))
			}
			var poison string
			evs, _ := store.ReadAfter(ctx, 10, 1)
			poison = evs[0].ID
			h := func(ctx context.Context, ev domain.EventEnvelope[any]) error {
				tx := subscriptions.TxFromContext(ctx)
				require.NotNil(t, tx)
				if err := tx.Exec("INSERT INTO proj (event_id) VALUES (?)", ev.ID).Error; err != nil {
					return err
				}
				if ev.ID == poison {
					return fmt.Errorf("poison")
				}
				return nil
			}
			sub, err := subscriptions.NewSubscriber("proj", store, cps, h, subscriptions.WithBatchSize(7),
				subscriptions.WithPollInterval(20*time.Millisecond), subscriptions.WithParkingLot(lot),
				subscriptions.WithRetryBackoff(time.Millisecond, 4*time.Millisecond))
			require.NoError(t, err)
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan error)
			go func() { done <- sub.Run(rctx) }()
			require.Eventually(t, func() bool { l, err := sub.Lag(ctx); return err == nil && l == 0 }, 10*time.Second, 10*time.Millisecond)
			cancel()
			require.NoError(t, <-done)
			var n int64
			require.NoError(t, db.Raw("SELECT count(*) FROM proj").Scan(&n).Error)
			require.Equal(t, int64(24), n)
			parked, err := sub.ListParked(ctx)
			require.NoError(t, err)
			require.Len(t, parked, 1)
			require.Equal(t, 6, parked[0].Attempts)
			poison = ""
			require.NoError(t, sub.ReplayParked(ctx, parked[0].EventID))
			require.NoError(t, db.Raw("SELECT count(*) FROM proj").Scan(&n).Error)
			require.Equal(t, int64(25), n)
			_ = gorm.ErrRecordNotFound
		})
	}
}
