package pgevents

import (
	"errors"
	"fmt"
	"strings"

	"github.com/eventfeed/subscriptions/migrations/schema"
)

// TableQuery resolves the events table named $1 (TableName's form: bare
// for the search_path's, or schema-qualified) to its schema-qualified
// name as EventsTableQuery spells it (quote_ident of the schema and of
// the table); no row when there is none. It is what NewTable's qualified
// is.
const TableQuery = `SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname)
	FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)`

// TableName is the events table of the Postgres schema schemaName as a
// statement names it (schema.Qualified): `"tenant_1".events`, or events
// alone when schemaName is "" (the connection's search_path then selects
// it). It is TableQuery's argument.
func TableName(schemaName string) string { return schema.Qualified(schemaName, "events") }

// Table is the events table a Postgres store appends to and reads, with
// the statements of this package that name it and the append lock that
// guards its feed. The lock's key derives from the table's canonical,
// schema-qualified name (AppendLockKey of TableQuery's answer), never
// from how a store spells it: a store that reaches a table through its
// pool's search_path and one that names its schema (WithSchema) take the
// same lock, which the ordered feed's soundness rests on, and the tables
// of two schemas take two locks, so that their appends never wait for
// each other. A Table is immutable and safe for concurrent use; the zero
// value is not usable (NewTable).
type Table struct {
	schema    string
	qualified string
	sql       *tableSQL
}

// NewTable returns the events table of schemaName ("" for the
// search_path's), whose canonical name qualified is what TableQuery (or
// EventsTableQuery for "") returned for TableName(schemaName). An empty
// qualified (TableQuery returned no row) is an error saying that the
// table does not exist.
func NewTable(schemaName, qualified string) (Table, error) {
	if schemaName != "" {
		if err := schema.CheckSchemaName(schemaName); err != nil {
			return Table{}, err
		}
	}
	if qualified == "" {
		if schemaName == "" {
			return Table{}, errors.New("no events table on the search_path: migrate the schema first")
		}
		return Table{}, fmt.Errorf("no events table in schema %q: migrate it first (migrations.MigrateSchema)", schemaName)
	}
	return Table{schema: schemaName, qualified: qualified, sql: newTableSQL(TableName(schemaName))}, nil
}

// Schema is the schema the Table was made for, "" for the search_path's.
func (t Table) Schema() string { return t.schema }

// Name is the table as the statements name it (TableName).
func (t Table) Name() string { return t.sql.name }

// Qualified is the table's canonical schema-qualified name, the same for
// every store of the table however it names it.
func (t Table) Qualified() string { return t.qualified }

// LockKey is the key of the table's append lock (AppendLockKey).
func (t Table) LockKey() int64 { return AppendLockKey(t.qualified) }

// SelectEvents is SelectEvents on this table: whole events, to which a
// caller appends its WHERE, ORDER BY and LIMIT.
func (t Table) SelectEvents() string { return t.sql.selectEvents }

// SelectStored is SelectStored on this table.
func (t Table) SelectStored() string { return t.sql.selectStored }

// tableSQL is the statements of the package on one table, spelled once
// (each text is a statement of a driver's cache); on the bare events
// table they are the package's constants byte for byte.
type tableSQL struct {
	name                                          string
	selectEvents, selectStored, selectHeads       string
	checkedInsert, checkedInsertOne, mergedInsert string
	writeOne, writeMany, writeMerged              string
}

// eventsMarker is where a statement template names the events table.
const eventsMarker = "{{events}}"

func newTableSQL(name string) *tableSQL {
	in := func(template string) string { return strings.ReplaceAll(template, eventsMarker, name) }
	return &tableSQL{
		name:             name,
		selectEvents:     in(selectEventsTemplate),
		selectStored:     in(selectStoredTemplate),
		selectHeads:      in(selectHeadsTemplate),
		checkedInsert:    in(checkedInsertTemplate),
		checkedInsertOne: in(checkedInsertOneTemplate),
		mergedInsert:     in(mergedInsertTemplate),
		writeOne:         in(writeOneTemplate),
		writeMany:        in(writeManyTemplate),
		writeMerged:      in(writeMergedTemplate),
	}
}

// searchPathTable is the bare events table, for the tests' helpers.
var searchPathTable = Table{sql: newTableSQL("events")}
