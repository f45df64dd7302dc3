package subscriptions

import (
	"context"
	"fmt"

	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/migrations"
)

// GormStoreOption configures NewGormCheckpointStore and NewGormParkingLot.
type GormStoreOption func(*gormStoreConfig)

type gormStoreConfig struct {
	verifyOnly bool
}

// WithSchemaVerifyOnly makes the constructor run no DDL: it only checks
// (migrations.Verify) that the schema is complete, and fails with one error
// wrapping migrations.ErrSchemaMismatch that names whatever is missing and
// the migration file that adds it. Use it when the schema is managed by a
// migration tool applying migrations.FS and the application's role may not
// create tables. infrastructure.WithSchemaVerifyOnly does the same for the
// event store; migrations.VerifyOnly(db) says it once for all three
// constructors.
func WithSchemaVerifyOnly() GormStoreOption {
	return func(c *gormStoreConfig) { c.verifyOnly = true }
}

// ensureSchema applies the module's migrations (or, with
// WithSchemaVerifyOnly, only verifies them) for a constructor.
func ensureSchema(constructor string, db *gorm.DB, opts []GormStoreOption) error {
	var c gormStoreConfig
	for _, opt := range opts {
		if opt != nil {
			opt(&c)
		}
	}
	if err := migrations.Ensure(context.Background(), db, c.verifyOnly); err != nil {
		return fmt.Errorf("subscriptions: %s: %w", constructor, err)
	}
	return nil
}
