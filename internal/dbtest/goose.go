package dbtest

import (
	"context"
	"io/fs"
	"testing"
	"time"

	"github.com/pressly/goose/v3"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions/migrations"
)

// ApplyWithGoose applies the module's migration files (migrations.FS) to
// db with goose, a migration tool teams use, exactly as such a team would:
// goose reads the files and records them in its own goose_db_version
// table; the module's code is not involved. It returns goose's count of
// applied files.
func ApplyWithGoose(t testing.TB, db *gorm.DB) int {
	t.Helper()
	n, err := GooseUp(t, db)
	if err != nil {
		t.Fatalf("dbtest: goose up: %v", err)
	}
	return n
}

// GooseUp is ApplyWithGoose returning goose's error instead of failing
// the test.
func GooseUp(t testing.TB, db *gorm.DB) (int, error) {
	t.Helper()
	return gooseUp(t, db, 0)
}

// GooseUpTo applies the module's migration files up to version (00003 is
// 3) with goose, as ApplyWithGoose does: a database at an older schema
// version, as an earlier release of the module left it.
func GooseUpTo(t testing.TB, db *gorm.DB, version int64) {
	t.Helper()
	if _, err := gooseUp(t, db, version); err != nil {
		t.Fatalf("dbtest: goose up to %d: %v", version, err)
	}
}

// gooseUp applies the files up to version, or every file for 0.
func gooseUp(t testing.TB, db *gorm.DB, version int64) (int, error) {
	t.Helper()
	dialect := goose.DialectSQLite3
	if db.Name() == "postgres" {
		dialect = goose.DialectPostgres
	}
	dir, err := migrations.Dir(db.Name())
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	files, err := fs.Sub(migrations.FS, dir)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	provider, err := goose.NewProvider(dialect, sqlDB, files)
	if err != nil {
		t.Fatalf("dbtest: goose: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var results []*goose.MigrationResult
	if version > 0 {
		results, err = provider.UpTo(ctx, version)
	} else {
		results, err = provider.Up(ctx)
	}
	return len(results), err
}

// GooseBackends lists SQLite files and Postgres schemas to which goose has
// applied the migration files (ApplyWithGoose): empty ones, and ones with
// the original module's (empty) tables, taken over by the files. The
// stores' behavioural suites run on them too: the files alone, applied by
// a real migration tool, give the module everything it needs.
func GooseBackends() []Backend {
	original := func(open func(testing.TB) *gorm.DB) func(testing.TB) *gorm.DB {
		return func(t testing.TB) *gorm.DB {
			db := open(t)
			CreateOriginalSchema(t, db, false)
			ApplyWithGoose(t, db)
			return db
		}
	}
	return []Backend{
		{Name: "sqlite-file-original-goose", Open: original(NewSQLiteFile)},
		{Name: "postgres-original-goose", Open: original(func(t testing.TB) *gorm.DB { return NewPostgres(t).DB }), Postgres: true},
		{Name: "sqlite-file-goose", Open: func(t testing.TB) *gorm.DB {
			db := NewSQLiteFile(t)
			ApplyWithGoose(t, db)
			return db
		}},
		{Name: "postgres-goose", Open: func(t testing.TB) *gorm.DB {
			db := NewPostgres(t).DB
			ApplyWithGoose(t, db)
			return db
		}, Postgres: true},
	}
}
