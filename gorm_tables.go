package subscriptions

import (
	"github.com/eventfeed/subscriptions/migrations/schema"
)

// gormTables are the module's tables as the statements of a
// GormCheckpointStore or GormParkingLot name them (schema.Qualified): in
// the schema of WithSchema, or bare when the pool's search_path selects
// them, which leaves every statement the original module's, byte for
// byte. Column references qualified by a table's bare name
// (subscriber_checkpoints.position in an upsert) need no schema: a
// schema-qualified table is still referred to by its name. It is
// immutable.
type gormTables struct {
	checkpoints, attempts, pauses, catchUps, parked, events string
}

// tablesIn returns the tables in schemaName ("" for the search_path's).
func tablesIn(schemaName string) gormTables {
	return gormTables{
		checkpoints: schema.Qualified(schemaName, "subscriber_checkpoints"),
		attempts:    schema.Qualified(schemaName, "subscriber_attempts"),
		pauses:      schema.Qualified(schemaName, "subscriber_pauses"),
		catchUps:    schema.Qualified(schemaName, "subscriber_catch_ups"),
		parked:      schema.Qualified(schemaName, "parked_events"),
		events:      schema.Qualified(schemaName, "events"),
	}
}
