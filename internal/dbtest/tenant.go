package dbtest

import (
	"testing"

	"gorm.io/gorm"
)

// TenantBackend is Postgres with the module's tables in a schema of their
// own, which the pool's search_path does not name: the stores reach them
// only through WithSchema, so a statement that names a table unqualified
// fails. It is not in GormBackends: it runs on the suites of the stores
// that take WithSchema, which open it with NewTenant (Open fails the
// test).
func TenantBackend() Backend {
	return Backend{Name: "postgres-schema", Postgres: true, Tenant: true, Open: func(t testing.TB) *gorm.DB {
		t.Helper()
		t.Fatal("dbtest: the postgres-schema backend's tables are reached through WithSchema: open it with NewTenant")
		return nil
	}}
}

// Tenant is one test's tenant of a shared pool on the test server.
// Schema, once a store given WithSchema(Schema) has migrated it, holds the
// module's tables; the embedded Postgres (DB, DSN, Open) is the pool's
// side: its own schema, Postgres.Schema, is the one the search_path
// names, and stays empty.
type Tenant struct {
	*Postgres
	// Schema is the tenant's schema (NewSchema): its name needs quoting.
	Schema string
}

// NewTenant creates, for the test, a schema for the pool's search_path
// (as NewPostgres does) and a tenant schema beside it (as NewSchema
// names it), both dropped at cleanup.
func NewTenant(t testing.TB) *Tenant {
	t.Helper()
	RequirePostgres(t)
	pool, tenant := "t_"+randomHex(8), tenantSchemaName()
	createSchemas(t, pool, tenant)
	return &Tenant{Postgres: openOnSchema(t, pool), Schema: tenant}
}

// NewSchema creates an empty schema on the test server and returns its
// name, which holds a capital, a space and a double quote, so that a
// statement that does not quote it fails. It is dropped at cleanup.
func NewSchema(t testing.TB) string {
	t.Helper()
	RequirePostgres(t)
	name := tenantSchemaName()
	createSchemas(t, name)
	return name
}

func tenantSchemaName() string { return `Tenant "q" ` + randomHex(6) }
