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
//
// Package schema holds the files and the engine-neutral code; this package
// applies them through a *gorm.DB, and a backend without GORM (package
// pgxstore) through schema.DB.
package migrations

import (
	"context"
	"errors"
	"fmt"

	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/migrations/schema"
)

// FS holds the migration files: postgres/*.up.sql and sqlite/*.up.sql.
// Dir names the directory for a dialect.
var FS = schema.FS

// VersionTable is the table in which every migration file records its
// version.
const VersionTable = schema.VersionTable

// ErrSchemaMismatch is wrapped by Verify's error when the database lacks
// something this module needs: a table, a column, an index, or the record
// of a migration. Constructors given WithSchemaVerifyOnly return it too,
// so an application can tell "apply the migrations" from other failures.
var ErrSchemaMismatch = schema.ErrSchemaMismatch

// Dir returns FS's directory for a GORM dialect name (db.Name()):
// "postgres" or "sqlite". Other engines are not supported.
func Dir(dialect string) (string, error) { return schema.Dir(dialect) }

// Migrate applies the migrations of db's dialect that the database has not
// recorded, in order, in one transaction (schema.Migrate describes the
// lock and the idempotence that make it safe to call on every start and
// from many processes at once). On a *gorm.DB bound to a transaction it
// runs inside that transaction.
//
// db's role needs the right to create tables in the current schema (the
// first schema of search_path on Postgres) when anything is pending. It is
// safe for concurrent use; db is not retained.
func Migrate(ctx context.Context, db *gorm.DB) error {
	h, err := handle("Migrate", ctx, db)
	if err != nil {
		return err
	}
	return schema.Migrate(ctx, h)
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
	h, err := handle("Verify", ctx, db)
	if err != nil {
		return err
	}
	return schema.Verify(ctx, h)
}

// MigrateSchema is Migrate into the Postgres schema name instead of the
// schema db's search_path selects (schema.InSchema): the tables are
// created there whatever the pool's search_path, which is how many
// tenants' stores share one pool (subscriptions.WithSchema). The schema
// must exist (CREATE SCHEMA); its name is taken exactly as given. It is an
// error on SQLite, which has no schemas, and for a name
// schema.CheckSchemaName refuses. It is safe for concurrent use.
func MigrateSchema(ctx context.Context, db *gorm.DB, name string) error {
	h, err := handleIn("MigrateSchema", ctx, db, name)
	if err != nil {
		return err
	}
	return schema.Migrate(ctx, h)
}

// VerifySchema is Verify of the Postgres schema name (see MigrateSchema):
// it changes nothing, and its error wraps ErrSchemaMismatch when the
// schema lacks something.
func VerifySchema(ctx context.Context, db *gorm.DB, name string) error {
	h, err := handleIn("VerifySchema", ctx, db, name)
	if err != nil {
		return err
	}
	return schema.Verify(ctx, h)
}

func handle(fn string, ctx context.Context, db *gorm.DB) (schema.DB, error) {
	if db == nil || db.Config == nil || db.Dialector == nil {
		return nil, fmt.Errorf("migrations: %s: nil or unopened *gorm.DB (use gorm.Open)", fn)
	}
	return gormDB{db: db.WithContext(ctx)}, nil
}

// handleIn is handle bound to the schema name (schema.InSchema).
func handleIn(fn string, ctx context.Context, db *gorm.DB, name string) (schema.DB, error) {
	h, err := handle(fn, ctx, db)
	if err != nil {
		return nil, err
	}
	if h, err = schema.InSchema(h, name); err != nil {
		return nil, fmt.Errorf("migrations: %s: %w", fn, err)
	}
	return h, nil
}

// gormDB is schema.DB on a *gorm.DB: its statements join the handle's
// transaction, if it is bound to one.
type gormDB struct{ db *gorm.DB }

func (g gormDB) Dialect() string { return g.db.Name() }

func (g gormDB) Exec(ctx context.Context, query string, args ...any) error {
	return g.db.WithContext(ctx).Exec(query, args...).Error
}

func (g gormDB) Query(ctx context.Context, query string, args []any, row func(scan func(dest ...any) error) error) error {
	rows, err := g.db.WithContext(ctx).Raw(query, args...).Rows()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := row(rows.Scan); err != nil {
			return err
		}
	}
	return errors.Join(rows.Err(), rows.Close())
}

func (g gormDB) InTx(ctx context.Context, fn func(tx schema.DB) error) error {
	return g.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return fn(gormDB{db: tx}) })
}
