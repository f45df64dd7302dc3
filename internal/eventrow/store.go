package eventrow

import (
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/domain"
)

// storeDB is infrastructure's answer to "which *gorm.DB does this event
// store read through", set by RegisterStoreDB from that package's init
// (which runs before any importer's code). The subscriptions package needs
// it to tell whether a checkpoint store shares the events' database (the
// pipelined acquire) and to read a partition's events in SQL; an exported
// GormEventStore.DB would widen the public API for that internal use alone.
var storeDB func(domain.EventStore) (*gorm.DB, bool)

// RegisterStoreDB sets the function StoreDB asks. Package infrastructure
// calls it once, from init; it is not safe to call concurrently with
// StoreDB.
func RegisterStoreDB(f func(domain.EventStore) (*gorm.DB, bool)) { storeDB = f }

// StoreDB returns the handle a GORM event store was built on; false for
// any other store.
func StoreDB(store domain.EventStore) (*gorm.DB, bool) {
	if storeDB == nil || store == nil {
		return nil, false
	}
	return storeDB(store)
}

// storeSchema is infrastructure's answer to "which Postgres schema do
// this event store's tables live in" ("" for the search_path's), set by
// RegisterStoreSchema; nil means every store reads the search_path's.
var storeSchema func(domain.EventStore) string

// RegisterStoreSchema sets the function StoreSchema asks. Package
// infrastructure calls it once, from init, when its GORM event store can
// name a schema of its own; it is not safe to call concurrently with
// StoreSchema.
func RegisterStoreSchema(f func(domain.EventStore) string) { storeSchema = f }

// StoreSchema returns the Postgres schema the GORM event store store reads
// ("" when the pool's search_path selects its tables): a checkpoint store
// shares its feed only when it names the same schema, since a batch reads
// the events table of its own schema.
func StoreSchema(store domain.EventStore) string {
	if storeSchema == nil || store == nil {
		return ""
	}
	return storeSchema(store)
}
