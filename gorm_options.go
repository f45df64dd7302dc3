package subscriptions

import (
	"context"
	"fmt"
	"strings"

	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/migrations"
)

// GormStoreOption configures NewGormCheckpointStore and NewGormParkingLot.
type GormStoreOption func(*gormStoreConfig)

type gormStoreConfig struct {
	verifyOnly bool
	schema     string // WithSchema; "" for the pool's search_path
	schemaSet  bool   // WithSchema was given (an empty name is refused)
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

// WithSchema makes NewGormCheckpointStore or NewGormParkingLot use the
// module's tables in the Postgres schema name instead of those the pool's
// search_path selects: every statement names its tables
// schema-qualified, and the constructor migrates (or, with
// WithSchemaVerifyOnly, verifies) that schema (migrations.MigrateSchema).
// The schema must exist (CREATE SCHEMA); its name is quoted, so it is
// taken exactly as given. It is how many tenants' stores share one pool
// (see Group): a connection serves any tenant, so the pool's size, not
// the number of tenants, bounds the connections. SQLite has no schemas:
// there the option is an error (give each tenant a database file).
func WithSchema(name string) GormStoreOption {
	return func(c *gormStoreConfig) { c.schema, c.schemaSet = name, true }
}

// ensureSchema applies the module's migrations (or, with
// WithSchemaVerifyOnly, only verifies them) for a constructor, in the
// schema of WithSchema when given, and returns that schema ("" for the
// search_path's).
func ensureSchema(constructor string, db *gorm.DB, opts []GormStoreOption) (string, error) {
	var c gormStoreConfig
	for _, opt := range opts {
		if opt != nil {
			opt(&c)
		}
	}
	switch {
	case c.schemaSet && c.schema == "":
		return "", fmt.Errorf("subscriptions: %s: WithSchema: empty schema name", constructor)
	case strings.Contains(c.schema, "?"):
		// GORM takes every ? of a statement's text for a placeholder,
		// even inside a quoted identifier.
		return "", fmt.Errorf("subscriptions: %s: WithSchema: schema name %q contains \"?\", which GORM reads as a placeholder", constructor, c.schema)
	}
	if err := migrations.EnsureSchema(context.Background(), db, c.schema, c.verifyOnly); err != nil {
		return "", fmt.Errorf("subscriptions: %s: %w", constructor, err)
	}
	return c.schema, nil
}
