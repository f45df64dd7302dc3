package schema

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// ErrSchemaMismatch is wrapped by Verify's error when the database lacks
// something this module needs: a table, a column, an index, or the record
// of a migration. Constructors given WithSchemaVerifyOnly return it too,
// so an application can tell "apply the migrations" from other failures.
var ErrSchemaMismatch = errors.New("database schema is not the one this module needs")

// object is a table, column, index or trigger that a migration creates and
// Verify looks for. Unique indexes are found by their columns, not their
// names: a table taken over from the original module has the same keys
// under the names GORM gave them.
type object struct {
	kind  string // "table", "column", "index", "unique" or "trigger"
	table string // the table, for all kinds but "table"
	name  string // for "unique": the columns, comma-separated, in order
}

func (o object) String() string {
	switch o.kind {
	case "column":
		return "column " + o.table + "." + o.name
	case "unique":
		return "unique index on " + o.table + " (" + strings.ReplaceAll(o.name, ",", ", ") + ")"
	case "trigger":
		return "trigger " + o.name + " on " + o.table
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

// unique is a unique index (or primary key) on table over the columns.
func unique(table string, columns ...string) []object {
	return []object{{kind: "unique", table: table, name: strings.Join(columns, ",")}}
}

// manifest lists, per dialect and migration version, what the migration
// creates: what Verify checks. A test applies the files one by one and
// checks that each adds exactly its entry, so the two cannot drift apart.
// A new migration file adds an entry here.
var manifest = map[string]map[int64][]object{
	Postgres: {
		1: concat(
			columns(VersionTable, "version", "applied_at"),
			unique(VersionTable, "version"),
			columns("events", "id", "aggregate_id", "event_type", "sequence_no", "transaction_id", "position", "payload", "metadata", "created_at"),
			unique("events", "id"),
			unique("events", "aggregate_id", "sequence_no"),
			unique("events", "position"),
			indexes("events", "idx_events_transaction_id"),
			columns("subscriber_checkpoints", "subscriber", "position", "updated_at"),
			unique("subscriber_checkpoints", "subscriber"),
			columns("parked_events", "key", "subscriber_key", "subscriber", "event_id", "event_type", "position", "error", "attempts", "parked_at"),
			unique("parked_events", "key"),
			indexes("parked_events", "idx_parked_events_position"),
			[]object{{kind: "trigger", table: "parked_events", name: "parked_events_keys"}},
		),
		2: {{kind: "column", table: "parked_events", name: "aggregate_id"}},
		3: concat(
			columns("subscriber_attempts", "subscriber", "position", "event_id", "through", "attempts", "last_error", "updated_at"),
			unique("subscriber_attempts", "subscriber"),
		),
		4: {
			{kind: "column", table: "subscriber_attempts", name: "holder"},
			{kind: "column", table: "subscriber_attempts", name: "holder_pid"},
			{kind: "column", table: "subscriber_attempts", name: "claimed_at"},
		},
		5: concat(
			columns("subscriber_pauses", "subscriber", "paused_at", "reason"),
			unique("subscriber_pauses", "subscriber"),
		),
		6: concat(
			[]object{{kind: "column", table: "subscriber_checkpoints", name: "redelivered_through"}},
			columns("subscriber_catch_ups", "subscriber", "through", "started_at"),
			unique("subscriber_catch_ups", "subscriber"),
		),
		7: parkedQueues,
	},
	SQLite: {
		1: concat(
			columns(VersionTable, "version", "applied_at"),
			columns("events", "id", "aggregate_id", "event_type", "sequence_no", "transaction_id", "position", "payload", "metadata", "created_at"),
			unique("events", "id"),
			unique("events", "aggregate_id", "sequence_no"),
			unique("events", "position"),
			indexes("events", "idx_events_transaction_id"),
			columns("subscriber_checkpoints", "subscriber", "position", "updated_at"),
			unique("subscriber_checkpoints", "subscriber"),
			columns("parked_events", "subscriber", "event_id", "event_type", "position", "error", "attempts", "parked_at"),
			unique("parked_events", "subscriber", "event_id"),
			indexes("parked_events", "idx_parked_events_position"),
		),
		2: {{kind: "column", table: "parked_events", name: "aggregate_id"}},
		3: concat(
			columns("subscriber_attempts", "subscriber", "position", "event_id", "through", "attempts", "last_error", "updated_at"),
			unique("subscriber_attempts", "subscriber"),
		),
		4: nil, // SQLite needs no attempt claim
		5: concat(
			columns("subscriber_pauses", "subscriber", "paused_at", "reason"),
			unique("subscriber_pauses", "subscriber"),
		),
		6: concat(
			[]object{{kind: "column", table: "subscriber_checkpoints", name: "redelivered_through"}},
			columns("subscriber_catch_ups", "subscriber", "through", "started_at"),
			unique("subscriber_catch_ups", "subscriber"),
		),
		7: parkedQueues,
	},
}

// parkedQueues is what 00007 adds on both engines.
var parkedQueues = []object{
	{kind: "column", table: "parked_events", name: "held_by"},
	{kind: "index", table: "parked_events", name: "idx_parked_events_heads"},
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
func Verify(ctx context.Context, db DB) error {
	dialect, all, done, err := state(ctx, "Verify", db)
	if err != nil {
		return err
	}
	var problems []string
	missingTables := map[string]bool{}
	for _, m := range all {
		for _, o := range manifest[dialect][m.version] {
			if o.kind != "table" && missingTables[o.table] {
				continue // the table's absence says it all
			}
			ok, err := exists(ctx, db, o)
			if err != nil {
				return fmt.Errorf("migrations: verify %s: %w", o, err)
			}
			if !ok {
				if o.kind == "table" {
					missingTables[o.name] = true
				}
				problems = append(problems, fmt.Sprintf("missing %s (added by %s/%s)", o, dialect, m.file))
			}
		}
		if !done[m.version] {
			problems = append(problems, fmt.Sprintf("migration %s/%s is not recorded in %s", dialect, m.file, VersionTable))
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("migrations: %w: %s; apply the files in migrations.FS directory %q with your migration tool, or call migrations.Migrate with a role allowed to create tables",
		ErrSchemaMismatch, strings.Join(problems, "; "), dialect)
}

// exists looks one object up in the catalog, through the search path on
// Postgres (where the module's own statements will find their tables).
func exists(ctx context.Context, db DB, o object) (bool, error) {
	var q string
	args := []any{o.table, o.name}
	postgres := db.Dialect() == Postgres
	switch {
	case postgres && o.kind == "table":
		q, args = "SELECT count(*) FROM pg_class WHERE oid = to_regclass(?) AND relkind IN ('r', 'p')", []any{o.name}
	case postgres && o.kind == "index":
		q, args = "SELECT count(*) FROM pg_class WHERE oid = to_regclass(?) AND relkind = 'i'", []any{o.name}
	case postgres && o.kind == "column":
		q = "SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass(?) AND attname = ? AND attnum > 0 AND NOT attisdropped"
	case postgres && o.kind == "unique":
		q = `SELECT count(*) FROM pg_index i WHERE i.indrelid = to_regclass(?) AND i.indisunique AND i.indpred IS NULL
			AND (SELECT string_agg(a.attname, ',' ORDER BY k.ord) FROM unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
				JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum) = ?`
	case postgres && o.kind == "trigger":
		q = "SELECT count(*) FROM pg_trigger WHERE tgrelid = to_regclass(?) AND tgname = ? AND NOT tgisinternal"
	case o.kind == "table" || o.kind == "index":
		q, args = "SELECT count(*) FROM sqlite_master WHERE type = ? AND name = ?", []any{o.kind, o.name}
	case o.kind == "column":
		q = "SELECT count(*) FROM pragma_table_info(?) WHERE name = ?"
	case o.kind == "unique":
		q = `SELECT count(*) FROM pragma_index_list(?) l WHERE l."unique" = 1 AND l.partial = 0
			AND (SELECT group_concat(name, ',') FROM (SELECT name FROM pragma_index_info(l.name) ORDER BY seqno)) = ?`
	default:
		return false, fmt.Errorf("no catalog check for %s on %s", o.kind, db.Dialect())
	}
	n, err := count(ctx, db, q, args...)
	return n > 0, err
}
