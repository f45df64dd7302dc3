package infrastructure

import (
	"fmt"

	"github.com/eventfeed/subscriptions/infrastructure/pgevents"
)

// GormEventStoreOption configures NewGormEventStore. Options are applied in
// order; NewGormEventStore validates the result and names the offending
// option when a value is unusable.
type GormEventStoreOption func(*gormEventStoreConfig)

type gormEventStoreConfig struct {
	channel    string
	verifyOnly bool
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
