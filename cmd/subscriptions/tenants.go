package main

import (
	"context"
	"fmt"
	"path"
	"slices"
	"strings"
)

// Tenants as schemas of one Postgres database (subscriptions.Group's
// tenants, docs/tenants.md): -schemas PATTERN runs a reading command over
// every schema whose name matches PATTERN and that has the module's
// checkpoint table, with a TENANT column (the schema's name); -tenant NAME
// picks one schema. A command that changes a subscriber (writes) takes
// exactly one tenant, named with -tenant: a pattern never selects what a
// write changes, even when it matches one schema today.

// writes are the commands that change a subscriber.
var writes = map[string]bool{"parked discard": true, "reset": true, "pause": true, "resume": true, "repartition": true}

// tenantMode reports whether -schemas or -tenant was given: the commands
// then run per schema and name each row's tenant.
func (c *cli) tenantMode() bool { return c.schemas != "" || c.tenant != "" }

// checkTenantFlags checks -schemas and -tenant before any connection: a
// Postgres DSN, a well-formed pattern that -tenant matches, and one tenant
// for a write.
func (c *cli) checkTenantFlags(cmd string) error {
	if !c.tenantMode() {
		return nil
	}
	if !isPostgres(c.dsn) {
		return usageError{"-schemas and -tenant take a Postgres DSN: SQLite has no schemas (give each tenant a database file of its own)"}
	}
	if c.schemas != "" {
		if _, err := path.Match(c.schemas, ""); err != nil {
			return usageError{fmt.Sprintf("-schemas %q: not a pattern (* any run of characters, ? one, [a-z] a class): %v", c.schemas, err)}
		}
	}
	if c.tenant != "" && c.schemas != "" {
		if ok, _ := path.Match(c.schemas, c.tenant); !ok {
			return usageError{fmt.Sprintf("-tenant %q does not match -schemas %q", c.tenant, c.schemas)}
		}
	}
	if (writes[cmd] || cmd == "migrate" && !c.verify) && c.tenant == "" {
		return usageError{fmt.Sprintf("%s changes %s: name exactly one tenant with -tenant NAME (-schemas %q selects tenants for reading)",
			cmd, map[bool]string{true: "a subscriber", false: "a schema"}[cmd != "migrate"], c.schemas)}
	}
	return nil
}

// checkpointTable is the table whose presence makes a schema a tenant.
const checkpointTable = "subscriber_checkpoints"

// resolveTenants lists the schemas the command runs over (c.targets):
// -tenant's, which must have the checkpoint table (for migrate, only
// exist), or every schema matching -schemas that has it, sorted. A pattern
// that matches none is an error.
func (c *cli) resolveTenants(ctx context.Context, cmd string) error {
	if !c.tenantMode() {
		return nil
	}
	db, _, closeDB, err := openHandle(ctx, c.dsn)
	if err != nil {
		return err
	}
	// The pool every tenant's stores share (WithSchema): closed by
	// closePool when the command is done.
	c.pool, c.closePool = db, closeDB
	var all []string
	q := "SELECT schemaname FROM pg_catalog.pg_tables WHERE tablename = ? ORDER BY schemaname"
	if err := db.WithContext(ctx).Raw(q, checkpointTable).Scan(&all).Error; err != nil {
		return fmt.Errorf("list the schemas with a %s table: %w", checkpointTable, err)
	}
	if c.tenant != "" {
		if cmd == "migrate" {
			var n int
			if err := db.WithContext(ctx).Raw("SELECT count(*) FROM pg_catalog.pg_namespace WHERE nspname = ?", c.tenant).Scan(&n).Error; err != nil {
				return fmt.Errorf("look up schema %q: %w", c.tenant, err)
			}
			if n == 0 {
				return fmt.Errorf("tenant %q: no such schema in this database (migrate creates tables, not schemas: CREATE SCHEMA first)", c.tenant)
			}
		} else if !slices.Contains(all, c.tenant) {
			return fmt.Errorf("tenant %q: no schema of that name has a %s table (%d schemas have one; status -schemas '*' lists their subscribers)",
				c.tenant, checkpointTable, len(all))
		}
		c.targets = []string{c.tenant}
		return nil
	}
	for _, s := range all {
		if ok, _ := path.Match(c.schemas, s); ok {
			c.targets = append(c.targets, s)
		}
	}
	if len(c.targets) == 0 {
		return fmt.Errorf("-schemas %q: no schema of that name has a %s table (%d schemas have one); nothing was read", c.schemas, checkpointTable, len(all))
	}
	return nil
}

// each runs fn on the database of every tenant (c.targets), one after
// another, on the command's one pool (c.pool: the stores name their
// tables in the tenant's schema); without -schemas or -tenant, once on
// the DSN's database. An error, fn's or opening a tenant's, ends the run,
// naming the tenant.
func (c *cli) each(ctx context.Context, fn func(d *database) error) error {
	if !c.tenantMode() {
		d, err := openDatabase(ctx, c.dsn)
		if err != nil {
			return err
		}
		defer d.close()
		return fn(d)
	}
	for _, tenant := range c.targets {
		if err := c.inTenant(ctx, tenant, fn); err != nil {
			return tenantError{tenant, err}
		}
	}
	return nil
}

// inTenant runs fn on tenant's stores, all on c.pool and
// schema-qualified (subscriptions.WithSchema, infrastructure.WithSchema):
// one pool serves every tenant, so a command over many schemas holds the
// pool's connections, not a pool per schema.
func (c *cli) inTenant(ctx context.Context, tenant string, fn func(d *database) error) error {
	d, err := withStores(ctx, c.pool, "postgres", tenant, func() {})
	if err != nil {
		return err
	}
	defer d.close()
	return fn(d)
}

// closeTenantPool closes the pool resolveTenants opened, if it did.
func (c *cli) closeTenantPool() {
	if c.closePool != nil {
		c.closePool()
	}
}

// tenantError is a command's failure in one tenant: the message names the
// tenant, and errors.Is and errors.As see the cause (a declined
// confirmation, a usage error).
type tenantError struct {
	tenant string
	err    error
}

func (e tenantError) Error() string { return fmt.Sprintf("tenant %q: %v", e.tenant, e.err) }
func (e tenantError) Unwrap() error { return e.err }

// subject names a subscriber for the terminal: `subscriber "orders"`, and
// with a tenant `subscriber "orders" of tenant "t_1"`.
func subject(tenant, name string) string {
	if tenant == "" {
		return fmt.Sprintf("subscriber %q", name)
	}
	return fmt.Sprintf("subscriber %q of tenant %q", name, tenant)
}

// tenantArgs is the -tenant flag to repeat in a suggested command line
// ("" without a tenant).
func tenantArgs(tenant string) string {
	if tenant == "" {
		return ""
	}
	return "-tenant " + shellQuote(tenant) + " "
}

// shellQuote quotes s for a shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// withTenant adds tenant to a JSON answer (none when "").
func withTenant(tenant string, out map[string]any) map[string]any {
	if tenant != "" {
		out["tenant"] = tenant
	}
	return out
}
