// Package sqlschema holds what the module's database code shares about
// engines: the dialect names it supports, the schema new tables go to, and
// the derivation of its advisory-lock keys. The schema itself lives in
// package migrations.
package sqlschema

import (
	"fmt"
	"hash/fnv"

	"gorm.io/gorm"
)

// Dialect names the databases this module supports (gorm.DB.Name()).
const (
	Postgres = "postgres"
	SQLite   = "sqlite"
)

// CurrentSchema returns the Postgres schema new tables go to: the first
// schema of search_path that exists. A search_path that names none (a
// typo, or a schema not created yet) is an error that says so.
func CurrentSchema(tx *gorm.DB) (string, error) {
	var row struct {
		Schema *string
		Path   string
	}
	if err := tx.Raw("SELECT current_schema() AS schema, current_setting('search_path') AS path").Scan(&row).Error; err != nil {
		return "", fmt.Errorf("read current schema: %w", err)
	}
	if row.Schema == nil {
		return "", fmt.Errorf("no schema to create tables in: search_path (%s) names no schema that exists; create the schema or correct search_path", row.Path)
	}
	return *row.Schema, nil
}

// Key derives a stable advisory-lock key from a purpose and a name (a
// schema-qualified table name, say), so that unrelated schemas and
// purposes never contend for one lock.
func Key(purpose, name string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("github.com/eventfeed/subscriptions\x00" + purpose + "\x00" + name))
	return int64(h.Sum64())
}
