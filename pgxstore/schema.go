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
// exactly as given. It is how many tenants' stores share one pool (see
// subscriptions.Group): a connection serves any tenant, so the pool's
// size, not the number of tenants, bounds the connections.
func WithSchema(name string) Option { return func(c *config) { c.schema = name } }

// ensureSchema applies the module's migrations the database lacks, or
// with verifyOnly only checks them.
func ensureSchema(ctx context.Context, constructor string, pool *pgxpool.Pool, c config) error {
	if pool == nil {
		return fmt.Errorf("pgxstore: %s: nil *pgxpool.Pool", constructor)
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
