package subscriptions

import (
	"context"

	"gorm.io/gorm"
)

// WithLotTxForTest attaches tx as a batch transaction of lot's database,
// so that Park writes through it (bulk fixtures in benchmarks).
func WithLotTxForTest(ctx context.Context, tx *gorm.DB, lot *GormParkingLot) context.Context {
	return withTx(ctx, tx, lot.pool)
}
