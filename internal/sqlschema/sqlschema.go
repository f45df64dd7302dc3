// Package sqlschema creates this module's tables safely while other
// processes use them.
//
// GORM's AutoMigrate is not used for the module's own tables: on an
// existing table it may issue ALTER statements that take exclusive locks,
// and two processes creating the same table at once can fail on Postgres's
// catalog unique indexes. Apps start replicas while traffic flows, so
// construction must never make a running process's statements fail. Ensure
// therefore does nothing (and takes no lock) when every object exists, and
// otherwise creates them with IF NOT EXISTS DDL inside a transaction that
// holds an advisory lock, so concurrent constructors take turns. The same
// transaction brings tables created by the original module (GORM
// AutoMigrate of its documented models) to the current shape, in place,
// without dropping or rewriting any row's data.
package sqlschema

import (
	"context"
	"fmt"
	"hash/fnv"

	"gorm.io/gorm"
)

// Dialect names the databases this module supports.
const (
	Postgres = "postgres"
	SQLite   = "sqlite"
)

// Objects describes the tables and indexes one store owns.
type Objects struct {
	// Names of every table and index, checked for existence first.
	Names []string
	// DDL per dialect: IF NOT EXISTS statements run in order.
	Postgres []string
	SQLite   []string
	// PostgresCurrent, when set, is a query returning true when the
	// existing objects are already in their current shape (a table taken
	// over from the original module may need columns, keys or triggers
	// added). When it returns false, Postgres runs after the existence
	// check too, so every statement there must be idempotent.
	PostgresCurrent string
}

// Ensure creates the objects that do not exist yet. db must be a Postgres
// or SQLite handle.
func Ensure(ctx context.Context, db *gorm.DB, objs Objects) error {
	db = db.WithContext(ctx)
	switch db.Name() {
	case Postgres:
		exists, err := allExistPostgres(db, objs.Names)
		if err != nil {
			return err
		}
		if exists && objs.PostgresCurrent != "" {
			if err := db.Raw(objs.PostgresCurrent).Scan(&exists).Error; err != nil {
				return fmt.Errorf("check the schema is current: %w", err)
			}
		}
		if exists {
			return nil
		}
		return db.Transaction(func(tx *gorm.DB) error {
			schema, err := currentSchema(tx)
			if err != nil {
				return err
			}
			if err := tx.Exec("SELECT pg_advisory_xact_lock(?)", Key("migrate", schema)).Error; err != nil {
				return fmt.Errorf("take migration lock: %w", err)
			}
			if objs.PostgresCurrent != "" {
				// Another process may have finished the same work while this
				// one waited for the lock: then take no table lock at all.
				exists, err := allExistPostgres(tx, objs.Names)
				if err != nil {
					return err
				}
				if exists {
					if err := tx.Raw(objs.PostgresCurrent).Scan(&exists).Error; err != nil {
						return fmt.Errorf("check the schema is current: %w", err)
					}
				}
				if exists {
					return nil
				}
			}
			return execAll(tx, objs.Postgres)
		})
	case SQLite:
		return db.Transaction(func(tx *gorm.DB) error { return execAll(tx, objs.SQLite) })
	default:
		return fmt.Errorf("unsupported dialect %q", db.Name())
	}
}

// currentSchema returns the schema new tables go to: the first schema of
// search_path that exists. A search_path that names none (a typo, or a
// schema not created yet) is an error that says so.
func currentSchema(tx *gorm.DB) (string, error) {
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

func allExistPostgres(db *gorm.DB, names []string) (bool, error) {
	for _, name := range names {
		var exists bool
		if err := db.Raw("SELECT to_regclass(?) IS NOT NULL", name).Scan(&exists).Error; err != nil {
			return false, fmt.Errorf("check for %s: %w", name, err)
		}
		if !exists {
			return false, nil
		}
	}
	return true, nil
}

func execAll(tx *gorm.DB, stmts []string) error {
	for _, stmt := range stmts {
		if err := tx.Exec(stmt).Error; err != nil {
			return fmt.Errorf("%s: %w", stmt, err)
		}
	}
	return nil
}

// Key derives a stable advisory-lock key from a purpose and a name (a
// schema-qualified table name, say), so that unrelated schemas and
// purposes never contend for one lock.
func Key(purpose, name string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("github.com/eventfeed/subscriptions\x00" + purpose + "\x00" + name))
	return int64(h.Sum64())
}
