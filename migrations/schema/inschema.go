package schema

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// MaxSchemaBytes is Postgres's identifier limit (NAMEDATALEN-1): a longer
// schema name would be truncated by the server, naming another schema.
const MaxSchemaBytes = 63

// CheckSchemaName rejects a Postgres schema name the module's stores
// cannot name exactly: empty, longer than MaxSchemaBytes, or holding a NUL
// byte. Any other name is quoted (QuoteIdent), so it may hold capitals,
// spaces or quotes.
func CheckSchemaName(name string) error {
	switch {
	case name == "":
		return errors.New("empty schema name")
	case len(name) > MaxSchemaBytes:
		return fmt.Errorf("schema name %q is %d bytes, longer than Postgres's %d-byte identifier limit", name, len(name), MaxSchemaBytes)
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("schema name %q contains a NUL byte", name)
	}
	return nil
}

// QuoteIdent quotes a Postgres identifier as quote_ident does when it
// must: in double quotes, with each double quote doubled.
func QuoteIdent(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// Qualified returns table in schema, quoted, for splicing into a
// statement: `"tenant_1".subscriber_checkpoints`; table alone when schema
// is "" (the connection's search_path then selects it). table is one of
// the module's own table names, which need no quoting.
func Qualified(schema, table string) string {
	if schema == "" {
		return table
	}
	return QuoteIdent(schema) + "." + table
}

// InSchema returns db bound to the Postgres schema name, for Migrate and
// Verify to create and check the module's tables there whatever db's
// search_path: every statement runs in a transaction whose search_path is
// name alone (set_config local to the transaction), and a transaction db
// already holds gets its search_path back when the work is done. The
// schema must exist: Migrate creates tables, not schemas. It is an error
// on SQLite, which has no schemas, and for a name CheckSchemaName refuses.
// The result is safe for concurrent use as db is.
func InSchema(db DB, name string) (DB, error) {
	if db == nil {
		return nil, errors.New("migrations: InSchema: nil handle")
	}
	if db.Dialect() != Postgres {
		return nil, fmt.Errorf("migrations: InSchema: schema %q: %s has no schemas; give each tenant a database file of its own", name, db.Dialect())
	}
	if err := CheckSchemaName(name); err != nil {
		return nil, fmt.Errorf("migrations: InSchema: %w", err)
	}
	return schemaDB{db: db, name: name}, nil
}

type schemaDB struct {
	db   DB
	name string
	inTx bool // db is the transaction InTx set the search_path of
}

func (s schemaDB) Dialect() string { return s.db.Dialect() }

func (s schemaDB) Exec(ctx context.Context, query string, args ...any) error {
	if s.inTx {
		return s.db.Exec(ctx, query, args...)
	}
	return s.InTx(ctx, func(tx DB) error { return tx.Exec(ctx, query, args...) })
}

func (s schemaDB) Query(ctx context.Context, query string, args []any, row func(scan func(dest ...any) error) error) error {
	if s.inTx {
		return s.db.Query(ctx, query, args, row)
	}
	return s.InTx(ctx, func(tx DB) error { return tx.Query(ctx, query, args, row) })
}

func (s schemaDB) InTx(ctx context.Context, fn func(tx DB) error) error {
	if s.inTx {
		return fn(s)
	}
	return s.db.InTx(ctx, func(tx DB) error {
		var previous string
		var exists bool
		err := tx.Query(ctx, "SELECT current_setting('search_path'), EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = ?), set_config('search_path', ?, true) IS NOT NULL",
			[]any{s.name, QuoteIdent(s.name)}, func(scan func(...any) error) error {
				var set bool
				return scan(&previous, &exists, &set)
			})
		if err != nil {
			return fmt.Errorf("select schema %q: %w", s.name, err)
		}
		if !exists {
			return fmt.Errorf("schema %q does not exist: create it first (CREATE SCHEMA)", s.name)
		}
		if err := fn(schemaDB{db: tx, name: s.name, inTx: true}); err != nil {
			return err
		}
		// db may have joined a transaction of the caller's: leave its
		// search_path as it was.
		if err := tx.Exec(ctx, "SELECT set_config('search_path', ?, true)", previous); err != nil {
			return fmt.Errorf("restore search_path after schema %q: %w", s.name, err)
		}
		return nil
	})
}
