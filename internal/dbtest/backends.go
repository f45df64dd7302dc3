package dbtest

import (
	"testing"

	"gorm.io/gorm"
)

// Backend names one database a behavioural suite runs against.
type Backend struct {
	// Name is the subtest name: "sqlite-memory", "sqlite-file",
	// "sqlite-file-glebarez" or "postgres".
	Name string
	// Open returns a fresh, isolated database for one test.
	Open func(t testing.TB) *gorm.DB
	// Postgres reports whether Open returns a Postgres database.
	Postgres bool
	// Tenant marks TenantBackend: the database is opened with NewTenant,
	// and the stores are given its schema (WithSchema).
	Tenant bool
}

// GormBackends lists every database backend, in-memory SQLite first, and
// SQLite on both drivers (gorm.io/driver/sqlite and github.com/glebarez/sqlite). A
// suite runs as t.Run(b.Name, ...) for each; the Postgres one skips or
// fails (per SUBSCRIPTIONS_REQUIRE_POSTGRES) when no server answers.
func GormBackends() []Backend {
	return []Backend{
		{Name: "sqlite-memory", Open: NewSQLiteMemory},
		{Name: "sqlite-file", Open: NewSQLiteFile},
		// The pure-Go driver, on a file: the configuration a
		// CGO_ENABLED=0 application runs.
		{Name: "sqlite-file-glebarez", Open: Glebarez.NewFile},
		{Name: "postgres", Open: func(t testing.TB) *gorm.DB { return NewPostgres(t).DB }, Postgres: true},
	}
}
