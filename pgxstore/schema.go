package pgxstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eventfeed/subscriptions/migrations/schema"
)

// Option configures a constructor of this package.
type Option func(*config)

type config struct {
	verifyOnly bool
	schema     string // WithSchema; "" for the pool's search_path
	schemaSet  bool   // WithSchema was given (an empty name is refused)
	channel    string
	channelSet bool // WithNotifyChannel was given
}

func newConfig(opts []Option) config {
	c := config{}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c
}

// WithSchemaVerifyOnly makes a constructor run no DDL: it checks that the
// schema's migrations are applied (schema.Verify) and fails, wrapping
// schema.ErrSchemaMismatch, when one is not. For an application whose
// schema a migration tool manages and whose role may not create tables.
func WithSchemaVerifyOnly() Option { return func(c *config) { c.verifyOnly = true } }

// WithSchema makes a store use the module's tables in the Postgres
// schema name instead of those the pool's search_path selects: every
// statement names its tables schema-qualified, and the constructor
// migrates (or, with WithSchemaVerifyOnly, verifies) that schema. The
// schema must exist (CREATE SCHEMA); its name is quoted, so it is taken
// exactly as given, and a name schema.CheckSchemaName refuses (empty,
// over 63 bytes, a NUL byte) is the constructor's error. It is how many
// tenants' stores share one pool (see subscriptions.Group): a connection
// serves any tenant, so the pool's size, not the number of tenants,
// bounds the connections.
//
// The cost: each schema's statement texts are its own, and pgx's
// statement cache, per connection and keyed by text, holds one prepared
// statement per schema and text, 512 by default (statement_cache_capacity).
// A tenant's subscriber with a parking lot uses some 15 to 20; a
// connection serving more tenants than fit prepares a statement again on
// each miss and deallocates the one it evicts (a batch cycle of 4 round
// trips took 10). For many tenants, raise statement_cache_capacity to cover them,
// or run the pool in QueryExecModeExec, which caches nothing and keeps
// one round trip per statement (the server plans each anew).
// QueryExecModeCacheDescribe keys its cache by text as well
// (description_cache_capacity, 512): it spares the server's prepared
// statements, not the misses.
func WithSchema(name string) Option {
	return func(c *config) { c.schema, c.schemaSet = name, true }
}

// ensureSchema applies the module's migrations the database lacks, or
// with verifyOnly only checks them.
func ensureSchema(ctx context.Context, constructor string, pool *pgxpool.Pool, c config) error {
	if pool == nil {
		return fmt.Errorf("pgxstore: %s: nil *pgxpool.Pool", constructor)
	}
	if c.schemaSet {
		// Refused here, not left to InSchema: WithSchema("") would
		// otherwise fall back to the search_path's tables unnoticed.
		if err := schema.CheckSchemaName(c.schema); err != nil {
			return fmt.Errorf("pgxstore: %s: WithSchema: %w", constructor, err)
		}
	}
	var db schema.DB = poolDB{q: pool, pool: pool}
	var err error
	if c.schema != "" {
		if db, err = schema.InSchema(db, c.schema); err != nil {
			return fmt.Errorf("pgxstore: %s: %w", constructor, err)
		}
	}
	if c.verifyOnly {
		err = schema.Verify(ctx, db)
	} else {
		err = schema.Migrate(ctx, db)
	}
	if err != nil {
		return fmt.Errorf("pgxstore: %s: %w", constructor, err)
	}
	return nil
}

// querier is what a pool, a connection and a transaction share.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// poolDB is schema.DB on pgx.
type poolDB struct {
	q    querier
	pool *pgxpool.Pool // nil inside InTx
}

func (poolDB) Dialect() string { return schema.Postgres }

func rebind(query string, args []any) string {
	if len(args) == 0 {
		return query
	}
	return schema.Rebind(query)
}

func (p poolDB) Exec(ctx context.Context, query string, args ...any) error {
	_, err := p.q.Exec(ctx, rebind(query, args), args...)
	return err
}

func (p poolDB) Query(ctx context.Context, query string, args []any, row func(scan func(dest ...any) error) error) error {
	rows, err := p.q.Query(ctx, rebind(query, args), args...)
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

func (p poolDB) InTx(ctx context.Context, fn func(tx schema.DB) error) error {
	if p.pool == nil {
		return fn(p)
	}
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		return fn(poolDB{q: tx})
	})
}
