package migrations

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/internal/sqlschema"
)

// ErrSchemaMismatch is wrapped by Verify's error when the database lacks
// something this module needs: a table, a column, an index, or the record
// of a migration. Constructors given WithSchemaVerifyOnly return it too,
// so an application can tell "apply the migrations" from other failures.
var ErrSchemaMismatch = errors.New("database schema is not the one this module needs")

// object is a table, column or index that a migration creates and Verify
// looks for.
type object struct {
	kind  string // "table", "column" or "index"
	table string // for columns: the table
	name  string
}

func (o object) String() string {
	if o.kind == "column" {
		return "column " + o.table + "." + o.name
	}
	return o.kind + " " + o.name
}

func columns(table string, names ...string) []object {
	out := []object{{kind: "table", name: table}}
	for _, n := range names {
		out = append(out, object{kind: "column", table: table, name: n})
	}
	return out
}

func indexes(table string, names ...string) []object {
	out := make([]object, len(names))
	for i, n := range names {
		out[i] = object{kind: "index", table: table, name: n}
	}
	return out
}

// manifest lists, per dialect and migration version, what the migration
// creates: what Verify checks. A test applies the files one by one and
// checks that each adds exactly its entry, so the two cannot drift apart.
// A new migration file adds an entry here.
var manifest = map[string]map[int64][]object{
	sqlschema.Postgres: {
		1: concat(
			columns(VersionTable, "version", "applied_at"),
			indexes(VersionTable, VersionTable+"_pkey"),
			columns("events", "id", "aggregate_id", "event_type", "sequence_no", "transaction_id", "position", "payload", "metadata", "created_at"),
			indexes("events", "events_pkey", "events_aggregate_sequence_key", "events_position_key", "idx_events_transaction_id"),
			columns("subscriber_checkpoints", "subscriber", "position", "updated_at"),
			indexes("subscriber_checkpoints", "subscriber_checkpoints_pkey"),
			columns("parked_events", "key", "subscriber_key", "subscriber", "event_id", "event_type", "position", "error", "attempts", "parked_at"),
			indexes("parked_events", "parked_events_pkey", "idx_parked_events_position"),
		),
	},
	sqlschema.SQLite: {
		1: concat(
			columns(VersionTable, "version", "applied_at"),
			columns("events", "id", "aggregate_id", "event_type", "sequence_no", "transaction_id", "position", "payload", "metadata", "created_at"),
			indexes("events", "idx_events_transaction_id"),
			columns("subscriber_checkpoints", "subscriber", "position", "updated_at"),
			columns("parked_events", "subscriber", "event_id", "event_type", "position", "error", "attempts", "parked_at"),
			indexes("parked_events", "idx_parked_events_position"),
		),
	},
}

func concat(parts ...[]object) []object {
	var out []object
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// Verify checks, without changing anything, that db has every table,
// column and index this module's migrations create and records every
// migration as applied. Its error wraps ErrSchemaMismatch and names, in
// one message, each missing object and the migration file that adds it.
// Migrations recorded by a newer version of the module are not an error:
// schema changes are additive, so an older binary keeps working during a
// rolling upgrade.
//
// It reads the catalog only, so any role that can read the tables can run
// it; it is safe for concurrent use.
func Verify(ctx context.Context, db *gorm.DB) error {
	if db == nil {
		return fmt.Errorf("migrations: Verify: nil *gorm.DB")
	}
	all, err := load(db.Name())
	if err != nil {
		return err
	}
	db = db.WithContext(ctx)
	done, err := applied(db)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	var problems []string
	missingTables := map[string]bool{}
	for _, m := range all {
		for _, o := range manifest[db.Name()][m.version] {
			if o.kind != "table" && missingTables[o.table] {
				continue // the table's absence says it all
			}
			ok, err := exists(db, o)
			if err != nil {
				return fmt.Errorf("migrations: verify %s: %w", o, err)
			}
			if !ok {
				if o.kind == "table" {
					missingTables[o.name] = true
				}
				problems = append(problems, fmt.Sprintf("missing %s (added by %s/%s)", o, db.Name(), m.file))
			}
		}
		if !done[m.version] {
			problems = append(problems, fmt.Sprintf("migration %s/%s is not recorded in %s", db.Name(), m.file, VersionTable))
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("migrations: %w: %s; apply the files in migrations.FS directory %q with your migration tool, or call migrations.Migrate with a role allowed to create tables",
		ErrSchemaMismatch, strings.Join(problems, "; "), db.Name())
}

// exists looks one object up in the catalog, through the search path on
// Postgres (where the module's own statements will find their tables).
func exists(db *gorm.DB, o object) (bool, error) {
	var n int64
	var err error
	switch {
	case db.Name() == sqlschema.Postgres && o.kind == "column":
		err = db.Raw(`SELECT count(*) FROM pg_attribute
			WHERE attrelid = to_regclass(?) AND attname = ? AND attnum > 0 AND NOT attisdropped`, o.table, o.name).Scan(&n).Error
	case db.Name() == sqlschema.Postgres:
		relkind := "r"
		if o.kind == "index" {
			relkind = "i"
		}
		err = db.Raw("SELECT count(*) FROM pg_class WHERE oid = to_regclass(?) AND relkind = ?", o.name, relkind).Scan(&n).Error
	case o.kind == "column":
		err = db.Raw("SELECT count(*) FROM pragma_table_info(?) WHERE name = ?", o.table, o.name).Scan(&n).Error
	default:
		err = db.Raw("SELECT count(*) FROM sqlite_master WHERE type = ? AND name = ?", o.kind, o.name).Scan(&n).Error
	}
	return n > 0, err
}
