// Package migrations holds the database schema of this module as ordered
// SQL files, one directory per engine, and applies or checks it.
//
// The files in FS (postgres/ and sqlite/) are the one source of the
// module's DDL: the constructors (infrastructure.NewGormEventStore,
// subscriptions.NewGormCheckpointStore and NewGormParkingLot) apply them
// through Migrate, and a team that manages its schema with a migration
// tool applies the same files with that tool instead. They are named
// NNNNN_name.up.sql and carry goose's "-- +goose Up" annotation, so goose
// (goose.NewProvider with fs.Sub(FS, "postgres")), golang-migrate (iofs)
// and atlas read them as they are. Every statement is idempotent (but for
// SQLite's ADD COLUMN, which Migrate skips when the column exists), so a file
// may be applied to a database that already has what it creates: the
// original module's tables, or tables created by an earlier version of
// this module. Later schema changes are new numbered files; a file once
// released never changes.
//
// Each file ends by recording its version in the table
// subscriptions_schema_migrations, whichever tool applies it. Verify reads
// that record and the catalog, which is how a constructor given
// WithSchemaVerifyOnly checks a schema it may not change: an application
// can run under a role without CREATE rights once the files are applied.
package migrations

import (
	"bufio"
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/internal/sqlschema"
)

// FS holds the migration files: postgres/*.up.sql and sqlite/*.up.sql.
// Dir names the directory for a dialect.
//
//go:embed postgres/*.up.sql sqlite/*.up.sql
var FS embed.FS

// VersionTable is the table in which every migration file records its
// version.
const VersionTable = "subscriptions_schema_migrations"

// Dir returns FS's directory for a GORM dialect name (db.Name()):
// "postgres" or "sqlite". Other engines are not supported.
func Dir(dialect string) (string, error) {
	switch dialect {
	case sqlschema.Postgres, sqlschema.SQLite:
		return dialect, nil
	}
	return "", fmt.Errorf("migrations: dialect %q is not supported (use postgres or sqlite)", dialect)
}

// migration is one file of FS.
type migration struct {
	version int64
	file    string // base name, e.g. 00001_create_tables.up.sql
	sql     string
}

// load reads a dialect's migrations in version order.
func load(dialect string) ([]migration, error) {
	dir, err := Dir(dialect)
	if err != nil {
		return nil, err
	}
	entries, err := fs.ReadDir(FS, dir)
	if err != nil {
		return nil, fmt.Errorf("migrations: read %s: %w", dir, err)
	}
	var out []migration
	for _, e := range entries {
		name := e.Name()
		prefix, _, ok := strings.Cut(name, "_")
		version, err := strconv.ParseInt(prefix, 10, 64)
		if !ok || err != nil || version <= 0 {
			return nil, fmt.Errorf("migrations: %s/%s: file name must start with a positive version and an underscore", dir, name)
		}
		body, err := fs.ReadFile(FS, path.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("migrations: read %s/%s: %w", dir, name, err)
		}
		out = append(out, migration{version: version, file: name, sql: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i := 1; i < len(out); i++ {
		if out[i].version == out[i-1].version {
			return nil, fmt.Errorf("migrations: %s: %s and %s have the same version", dir, out[i-1].file, out[i].file)
		}
	}
	return out, nil
}

// statements splits a migration file into statements the way goose does
// for the files of this package: the Up section only, one statement per
// run of lines ending with a semicolon, or a StatementBegin/StatementEnd
// block; lines that are only a comment are dropped.
func statements(sql string) []string {
	var out []string
	var cur strings.Builder
	block := false
	flush := func() {
		if s := strings.TrimSpace(cur.String()); s != "" {
			out = append(out, s)
		}
		cur.Reset()
	}
	sc := bufio.NewScanner(strings.NewReader(sql))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "-- +goose Down"):
			flush()
			return out
		case strings.HasPrefix(trimmed, "-- +goose StatementBegin"):
			flush()
			block = true
			continue
		case strings.HasPrefix(trimmed, "-- +goose StatementEnd"):
			flush()
			block = false
			continue
		case strings.HasPrefix(trimmed, "--"):
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
		if !block && strings.HasSuffix(trimmed, ";") {
			flush()
		}
	}
	flush()
	return out
}

// applied returns the versions recorded in VersionTable (none when the
// table does not exist).
func applied(db *gorm.DB) (map[int64]bool, error) {
	var exists bool
	var err error
	if db.Name() == sqlschema.Postgres {
		err = db.Raw("SELECT to_regclass(?) IS NOT NULL", VersionTable).Scan(&exists).Error
	} else {
		var n int64
		err = db.Raw("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?", VersionTable).Scan(&n).Error
		exists = n > 0
	}
	if err != nil {
		return nil, fmt.Errorf("look for %s: %w", VersionTable, err)
	}
	out := map[int64]bool{}
	if !exists {
		return out, nil
	}
	var versions []int64
	if err := db.Raw("SELECT version FROM " + VersionTable).Scan(&versions).Error; err != nil {
		return nil, fmt.Errorf("read %s: %w", VersionTable, err)
	}
	for _, v := range versions {
		out[v] = true
	}
	return out, nil
}

// pending returns the migrations whose version is not recorded.
func pending(all []migration, done map[int64]bool) []migration {
	var out []migration
	for _, m := range all {
		if !done[m.version] {
			out = append(out, m)
		}
	}
	return out
}

// Migrate applies the migrations of db's dialect that the database has not
// recorded, in order, in one transaction. When every one is recorded it
// returns after one or two reads, taking no lock, so constructors call it
// on every start. On Postgres the transaction first takes an advisory lock
// derived from the current schema, so processes starting at once take
// turns (the later ones find the work done) and a running process's
// statements never fail because of it. The statements are idempotent (SQLite's ADD COLUMN is skipped
// when the column exists, see columnAlreadyAdded), so
// Migrate also completes a schema applied by another tool or created by
// the original module.
//
// db's role needs the right to create tables in the current schema (the
// first schema of search_path on Postgres) when anything is pending. It is
// safe for concurrent use; db is not retained.
func Migrate(ctx context.Context, db *gorm.DB) error {
	if db == nil || db.Config == nil || db.Dialector == nil {
		return fmt.Errorf("migrations: Migrate: nil or unopened *gorm.DB (use gorm.Open)")
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
	if len(pending(all, done)) == 0 {
		return nil
	}
	err = db.Transaction(func(tx *gorm.DB) error {
		if tx.Name() == sqlschema.Postgres {
			schema, err := sqlschema.CurrentSchema(tx)
			if err != nil {
				return err
			}
			if err := tx.Exec("SELECT pg_advisory_xact_lock(?)", sqlschema.Key("migrate", schema)).Error; err != nil {
				return fmt.Errorf("take the migration lock: %w", err)
			}
		}
		// Read again under the lock (on SQLite, inside the write
		// transaction): another process may have just migrated.
		done, err := applied(tx)
		if err != nil {
			return err
		}
		for _, m := range pending(all, done) {
			for _, stmt := range statements(m.sql) {
				if skip, err := columnAlreadyAdded(tx, stmt); err != nil || skip {
					if err != nil {
						return fmt.Errorf("apply %s/%s: %w", db.Name(), m.file, err)
					}
					continue
				}
				if err := tx.Exec(stmt).Error; err != nil {
					return fmt.Errorf("apply %s/%s: %w (statement: %s)", db.Name(), m.file, err, firstLine(stmt))
				}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	return nil
}

// addColumn matches a SQLite ADD COLUMN statement of the files, which
// cannot say IF NOT EXISTS.
var addColumn = regexp.MustCompile(`(?is)^ALTER\s+TABLE\s+(\w+)\s+ADD\s+COLUMN\s+(\w+)\s`)

// columnAlreadyAdded reports whether stmt is a SQLite ADD COLUMN whose
// column exists already, which Migrate then skips: SQLite has no ADD
// COLUMN IF NOT EXISTS, and a table created by an earlier build of this
// module (or by another tool) may have the column without recording the
// file that adds it. It runs inside Migrate's write transaction, so no
// other process adds the column between the check and the ALTER. Verify
// never runs it: a verify-only constructor changes nothing and reports the
// file as not recorded instead.
func columnAlreadyAdded(tx *gorm.DB, stmt string) (bool, error) {
	if tx.Name() != sqlschema.SQLite {
		return false, nil
	}
	m := addColumn.FindStringSubmatch(stmt)
	if m == nil {
		return false, nil
	}
	var n int64
	if err := tx.Raw("SELECT count(*) FROM pragma_table_info(?) WHERE name = ?", m[1], m[2]).Scan(&n).Error; err != nil {
		return false, fmt.Errorf("look for column %s.%s: %w", m[1], m[2], err)
	}
	return n > 0, nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return strings.TrimSpace(line)
}
