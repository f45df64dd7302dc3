package infrastructure

import (
	"fmt"
	"strings"

	"github.com/eventfeed/subscriptions/infrastructure/pgevents"
	"github.com/eventfeed/subscriptions/migrations/schema"
)

// GormEventStoreOption configures NewGormEventStore. Options are applied in
// order; NewGormEventStore validates the result and names the offending
// option when a value is unusable.
type GormEventStoreOption func(*gormEventStoreConfig)

type gormEventStoreConfig struct {
	channel    string
	verifyOnly bool
	schema     string // WithSchema; "" for the pool's search_path
	schemaSet  bool   // WithSchema was given (an empty name is refused)
}

func newGormEventStoreConfig(opts []GormEventStoreOption) (gormEventStoreConfig, error) {
	c := gormEventStoreConfig{channel: PostgresNotifyChannel}
	for _, opt := range opts {
		if opt != nil {
			opt(&c)
		}
	}
	if err := pgevents.CheckChannel(c.channel); err != nil {
		return c, fmt.Errorf("%w (WithNotifyChannel)", err)
	}
	if c.schemaSet {
		// Refused here: WithSchema("") would otherwise read the
		// search_path's table unnoticed.
		if err := schema.CheckSchemaName(c.schema); err != nil {
			return c, fmt.Errorf("WithSchema: %w", err)
		}
		if strings.Contains(c.schema, "?") {
			// GORM takes every ? of a statement's text for a
			// placeholder, even inside a quoted identifier.
			return c, fmt.Errorf("WithSchema: schema name %q contains \"?\", which GORM reads as a placeholder", c.schema)
		}
	}
	return c, nil
}

// WithNotifyChannel sets the channel on which the store NOTIFYs after every
// committed append on Postgres (default PostgresNotifyChannel,
// "pericarp_events"); pass the same name to the listener
// (subscriptions.WithListenerChannel). A NOTIFY reaches every session of
// the database that LISTENs on its channel, whatever their schema: stores
// in different schemas or services sharing one database should each have
// their own channel, or every append wakes every subscriber of them all,
// each paying a fruitless read of its feed.
//
// The name is passed to pg_notify as a value, never spliced into SQL, so
// any name is safe; an empty one, one longer than 63 bytes or one with a
// NUL byte could never be LISTENed to as given and is refused. SQLite
// stores do not notify and ignore the channel.
func WithNotifyChannel(channel string) GormEventStoreOption {
	return func(c *gormEventStoreConfig) { c.channel = channel }
}

// WithSchemaVerifyOnly makes NewGormEventStore run no DDL: it only checks
// (migrations.Verify) that the schema is complete, and fails with one error
// naming whatever is missing and the migration file that adds it. Use it
// when the schema is managed by a migration tool applying migrations.FS
// and the application's role may not create tables. migrations.VerifyOnly(db)
// says it once for this and the subscriptions package's constructors.
func WithSchemaVerifyOnly() GormEventStoreOption {
	return func(c *gormEventStoreConfig) { c.verifyOnly = true }
}

// WithSchema makes NewGormEventStore use the events table in the Postgres
// schema name instead of the one the pool's search_path selects: every
// statement (appends, reads, the head, ProbeHeads) names the table
// schema-qualified, and the constructor migrates (or, with
// WithSchemaVerifyOnly, verifies) that schema (migrations.MigrateSchema).
// The schema must exist (CREATE SCHEMA); its name is quoted, so it is
// taken exactly as given, and a name schema.CheckSchemaName refuses, or
// one holding "?" (GORM's placeholder), is the constructor's error.
// SQLite has no schemas: there the option is an error (give each tenant
// a database file).
//
// The append lock is the table's, whichever way a store reaches it: a
// store on the same table through the search_path takes the same lock,
// so the feed stays in order, and stores of two schemas take two locks.
// It is how many tenants' event stores share one pool, with
// subscriptions.WithSchema for their checkpoint stores and parking lots:
// the pool's size, not the number of tenants, bounds the connections.
// Each store keeps its own NOTIFY channel (WithNotifyChannel).
func WithSchema(name string) GormEventStoreOption {
	return func(c *gormEventStoreConfig) { c.schema, c.schemaSet = name, true }
}
