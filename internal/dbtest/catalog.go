package dbtest

import (
	"sort"
	"testing"

	"gorm.io/gorm"
)

// Catalog lists the tables, columns, indexes and triggers of the
// database's current schema (the first of search_path on Postgres), in
// migrations.Verify's words ("table x", "column x.y", "index z", "unique
// index on x (a, b)", "trigger t on x"), sorted: what a test compares to
// show that something created, or left alone, the schema.
func Catalog(t testing.TB, db *gorm.DB) []string {
	t.Helper()
	var out []string
	q := `SELECT 'table ' || c.relname FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r'
		UNION ALL SELECT 'column ' || c.relname || '.' || a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
			WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
		UNION ALL SELECT CASE WHEN i.indisunique AND i.indpred IS NULL
				THEN 'unique index on ' || t.relname || ' (' || (SELECT string_agg(a.attname, ', ' ORDER BY k.ord)
					FROM unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum) || ')'
				ELSE 'index ' || c.relname END
			FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid
			WHERE c.relnamespace = current_schema()::regnamespace
		UNION ALL SELECT 'trigger ' || g.tgname || ' on ' || c.relname FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid
			WHERE c.relnamespace = current_schema()::regnamespace AND NOT g.tgisinternal`
	if db.Name() == "sqlite" {
		q = `SELECT 'table ' || name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'
			UNION ALL SELECT 'column ' || m.name || '.' || p.name FROM sqlite_master m, pragma_table_info(m.name) p
				WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%'
			UNION ALL SELECT CASE WHEN l."unique" = 1 AND l.partial = 0
					THEN 'unique index on ' || m.name || ' (' || (SELECT group_concat(name, ', ') FROM (SELECT name FROM pragma_index_info(l.name) ORDER BY seqno)) || ')'
					ELSE 'index ' || l.name END
				FROM sqlite_master m, pragma_index_list(m.name) l WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%'
			UNION ALL SELECT 'trigger ' || name || ' on ' || tbl_name FROM sqlite_master WHERE type = 'trigger'`
	}
	if err := db.Raw(q).Scan(&out).Error; err != nil {
		t.Fatalf("dbtest: read the catalog: %v", err)
	}
	sort.Strings(out)
	return out
}
