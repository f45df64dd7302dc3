// Package schema is the engine-neutral core of package migrations: the
// module's migration files (FS) and applying (Migrate) and checking
// (Verify) them through any driver that implements DB. Package
// migrations applies them through a *gorm.DB; a backend that does not use
// GORM (package pgxstore) uses this package directly, so that GORM is not
// in its build. The files, their rules (idempotent, numbered, each
// recording its version) and the tools that read them are described in
// package migrations.
package schema

import (
	"bufio"
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// FS holds the migration files: postgres/*.up.sql and sqlite/*.up.sql.
// Dir names the directory for a dialect.
//
//go:embed postgres/*.up.sql sqlite/*.up.sql
var FS embed.FS

// VersionTable is the table in which every migration file records its
// version.
const VersionTable = "subscriptions_schema_migrations"

// The dialects this module supports, as DB.Dialect (and gorm.DB.Name)
// names them.
const (
	Postgres = "postgres"
	SQLite   = "sqlite"
)

// Dir returns FS's directory for a dialect: "postgres" or "sqlite".
// Other engines are not supported.
func Dir(dialect string) (string, error) {
	switch dialect {
	case Postgres, SQLite:
		return dialect, nil
	}
	return "", fmt.Errorf("migrations: dialect %q is not supported (use postgres or sqlite)", dialect)
}

// DB is what Migrate and Verify need of a database handle. Queries use ?
// placeholders; an implementation for a driver with numbered ones (pgx)
// rewrites them. SQL adapts a *sql.DB; package migrations adapts a
// *gorm.DB, joining its transaction if it has one.
type DB interface {
	// Dialect names the engine: Postgres or SQLite.
	Dialect() string
	// Exec runs a statement.
	Exec(ctx context.Context, query string, args ...any) error
	// Query runs a query and calls row for each result row, with a
	// function that scans the row's columns into dest.
	Query(ctx context.Context, query string, args []any, row func(scan func(dest ...any) error) error) error
	// InTx runs fn in one transaction, through a DB bound to it,
	// committing when fn returns nil.
	InTx(ctx context.Context, fn func(tx DB) error) error
}

// SQL adapts a database/sql handle of the given dialect to DB. It is safe
// for concurrent use, as db is; db is not closed.
func SQL(db *sql.DB, dialect string) DB { return sqlDB{db: db, run: db, dialect: dialect} }

// sqlRunner is what *sql.DB and *sql.Tx share.
type sqlRunner interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

type sqlDB struct {
	db      *sql.DB // nil inside InTx
	run     sqlRunner
	dialect string
}

func (s sqlDB) Dialect() string { return s.dialect }

func (s sqlDB) rebind(query string, args []any) string {
	if s.dialect != Postgres || len(args) == 0 {
		return query
	}
	return Rebind(query)
}

func (s sqlDB) Exec(ctx context.Context, query string, args ...any) error {
	_, err := s.run.ExecContext(ctx, s.rebind(query, args), args...)
	return err
}

func (s sqlDB) Query(ctx context.Context, query string, args []any, row func(scan func(dest ...any) error) error) error {
	rows, err := s.run.QueryContext(ctx, s.rebind(query, args), args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := row(rows.Scan); err != nil {
			return err
		}
	}
	return rows.Err()
}

func (s sqlDB) InTx(ctx context.Context, fn func(tx DB) error) error {
	if s.db == nil {
		return fn(s) // already in one
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(sqlDB{run: tx, dialect: s.dialect}); err != nil {
		return errors.Join(err, ignoreDone(tx.Rollback()))
	}
	return tx.Commit()
}

func ignoreDone(err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}

// Rebind rewrites the ? placeholders of query as $1, $2, ... for
// Postgres drivers that take numbered ones. A ? inside a quoted string or
// identifier is left alone.
func Rebind(query string) string {
	var b strings.Builder
	n := 0
	var quote rune
	for _, r := range query {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '?':
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// LockKey derives the advisory-lock key every backend of these tables
// takes for a purpose on a name, so that backends sharing a database
// coordinate, and unrelated schemas and purposes never contend for one
// lock. The purposes are "append" on the events table's schema-qualified,
// quoted name (pg_advisory_xact_lock before an append takes positions:
// the ordered feed of package infrastructure) and "migrate" on the
// current schema (Migrate).
func LockKey(purpose, name string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("github.com/eventfeed/subscriptions\x00" + purpose + "\x00" + name))
	return int64(h.Sum64())
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
func applied(ctx context.Context, db DB) (map[int64]bool, error) {
	q := "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?"
	if db.Dialect() == Postgres {
		q = "SELECT count(*) FROM pg_class WHERE oid = to_regclass(?)"
	}
	n, err := count(ctx, db, q, VersionTable)
	if err != nil {
		return nil, fmt.Errorf("look for %s: %w", VersionTable, err)
	}
	out := map[int64]bool{}
	if n == 0 {
		return out, nil
	}
	err = db.Query(ctx, "SELECT version FROM "+VersionTable, nil, func(scan func(...any) error) error {
		var v int64
		if err := scan(&v); err != nil {
			return err
		}
		out[v] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", VersionTable, err)
	}
	return out, nil
}

// count runs a query of one integer.
func count(ctx context.Context, db DB, q string, args ...any) (int64, error) {
	var n int64
	err := db.Query(ctx, q, args, func(scan func(...any) error) error { return scan(&n) })
	return n, err
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

// state reads what Migrate and Verify start from: db's dialect, its
// migrations and the versions the database records. fn names the caller
// in errors.
func state(ctx context.Context, fn string, db DB) (dialect string, all []migration, done map[int64]bool, err error) {
	if db == nil {
		return "", nil, nil, fmt.Errorf("migrations: %s: nil handle", fn)
	}
	dialect = db.Dialect()
	if all, err = load(dialect); err != nil {
		return "", nil, nil, err
	}
	if done, err = applied(ctx, db); err != nil {
		return "", nil, nil, fmt.Errorf("migrations: %w", err)
	}
	return dialect, all, done, nil
}

// currentSchema returns the Postgres schema new tables go to: the first
// schema of search_path that exists. A search_path that names none (a
// typo, or a schema not created yet) is an error that says so.
func currentSchema(ctx context.Context, db DB) (string, error) {
	var schema sql.NullString
	var searchPath string
	err := db.Query(ctx, "SELECT current_schema(), current_setting('search_path')", nil, func(scan func(...any) error) error {
		return scan(&schema, &searchPath)
	})
	if err != nil {
		return "", fmt.Errorf("read current schema: %w", err)
	}
	if !schema.Valid {
		return "", fmt.Errorf("no schema to create tables in: search_path (%s) names no schema that exists; create the schema or correct search_path", searchPath)
	}
	return schema.String, nil
}

// Migrate applies the migrations of db's dialect that the database has not
// recorded, in order, in one transaction. When every one is recorded it
// returns after one or two reads, taking no lock, so constructors call it
// on every start. On Postgres the transaction first takes an advisory lock
// derived from the current schema (LockKey), so processes starting at once
// take turns (the later ones find the work done) and a running process's
// statements never fail because of it. The statements are idempotent
// (SQLite's ADD COLUMN is skipped when the column exists, see
// columnAlreadyAdded), so Migrate also completes a schema applied by
// another tool or created by the original module.
//
// db's role needs the right to create tables in the current schema (the
// first schema of search_path on Postgres) when anything is pending. It is
// safe for concurrent use; db is not retained.
func Migrate(ctx context.Context, db DB) error {
	dialect, all, done, err := state(ctx, "Migrate", db)
	if err != nil {
		return err
	}
	if len(pending(all, done)) == 0 {
		return nil
	}
	err = db.InTx(ctx, func(tx DB) error {
		if dialect == Postgres {
			schema, err := currentSchema(ctx, tx)
			if err != nil {
				return err
			}
			if err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(?)", LockKey("migrate", schema)); err != nil {
				return fmt.Errorf("take the migration lock: %w", err)
			}
		}
		// Read again under the lock (on SQLite, inside the write
		// transaction): another process may have just migrated.
		done, err := applied(ctx, tx)
		if err != nil {
			return err
		}
		for _, m := range pending(all, done) {
			for _, stmt := range statements(m.sql) {
				if skip, err := columnAlreadyAdded(ctx, tx, stmt); err != nil || skip {
					if err != nil {
						return fmt.Errorf("apply %s/%s: %w", dialect, m.file, err)
					}
					continue
				}
				if err := tx.Exec(ctx, stmt); err != nil {
					return fmt.Errorf("apply %s/%s: %w (statement: %s)", dialect, m.file, err, firstLine(stmt))
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
func columnAlreadyAdded(ctx context.Context, tx DB, stmt string) (bool, error) {
	if tx.Dialect() != SQLite {
		return false, nil
	}
	m := addColumn.FindStringSubmatch(stmt)
	if m == nil {
		return false, nil
	}
	n, err := count(ctx, tx, "SELECT count(*) FROM pragma_table_info(?) WHERE name = ?", m[1], m[2])
	if err != nil {
		return false, fmt.Errorf("look for column %s.%s: %w", m[1], m[2], err)
	}
	return n > 0, nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return strings.TrimSpace(line)
}
