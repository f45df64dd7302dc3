package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/secret"
	"github.com/eventfeed/subscriptions/migrations"
)

// connectTimeout bounds connecting to Postgres.
const connectTimeout = 10 * time.Second

// database is an opened database with the module's stores on it.
type database struct {
	db   *gorm.DB
	kind string // "postgres" or "sqlite"
	// tenant is the schema the stores are on, given by -schemas or
	// -tenant ("" without: the DSN's search_path).
	tenant      string
	events      *infrastructure.GormEventStore
	checkpoints *subscriptions.GormCheckpointStore
	parking     *subscriptions.GormParkingLot
	close       func()
}

func isPostgres(d string) bool {
	if strings.HasPrefix(d, "postgres://") || strings.HasPrefix(d, "postgresql://") {
		return true
	}
	for _, k := range []string{"host=", "dbname=", "user=", "port="} {
		if strings.Contains(d, k) {
			return true
		}
	}
	return false
}

// secretsOf returns what must never be printed of d.
func secretsOf(d string) []string {
	s := secret.FromDSN(d)
	if isPostgres(d) {
		if cfg, err := pgx.ParseConfig(d); err == nil && cfg.Password != "" {
			s = secret.Normalize(append(s, cfg.Password))
		}
	}
	return s
}

func (c *cli) scrub(msg string) string { return secret.Scrub(msg, c.secrets) }

// openDatabase opens d and the module's stores for every command but
// migrate. It never changes the schema: a database without the module's
// checkpoint table is refused rather than given one (a mistyped DSN must
// not create tables, or, for SQLite, a new file), and so is one whose
// schema is incomplete or older than this version's, naming what is
// missing and `subscriptions migrate` as the fix (docs/operations.md: only
// migrate creates tables; a read-only command run by an operator, maybe
// with a role that may not create tables, must not migrate a database
// behind the application's back).
func openDatabase(ctx context.Context, d string) (*database, error) {
	db, kind, close, err := openHandle(ctx, d)
	if err != nil {
		return nil, err
	}
	return withStores(ctx, db, kind, "", close)
}

// openHandle opens d without reading or creating any table. A SQLite file
// must exist: a mistyped path must not create one.
func openHandle(ctx context.Context, d string) (db *gorm.DB, kind string, close func(), err error) {
	cfg := &gorm.Config{Logger: logger.Discard}
	if isPostgres(d) {
		kind = "postgres"
		pgcfg, err := pgx.ParseConfig(d)
		if err != nil {
			msg := err.Error()
			// pgx quotes the DSN; keep the reason only.
			if i := strings.LastIndex(msg, "`: "); strings.HasPrefix(msg, "cannot parse `") && i >= 0 {
				msg = msg[i+3:]
			}
			return nil, "", nil, fmt.Errorf("invalid Postgres DSN: %s (want postgres://user[:password]@host[:port]/database or key=value pairs)", msg)
		}
		if pgcfg.ConnectTimeout <= 0 || pgcfg.ConnectTimeout > connectTimeout {
			pgcfg.ConnectTimeout = connectTimeout
		}
		target := fmt.Sprintf("Postgres at %s:%d (database %q, user %q)", pgcfg.Host, pgcfg.Port, pgcfg.Database, pgcfg.User)
		pool := stdlib.OpenDB(*pgcfg)
		pool.SetMaxOpenConns(2)
		pctx, cancel := context.WithTimeout(ctx, connectTimeout)
		err = pool.PingContext(pctx)
		cancel()
		if err != nil {
			pool.Close()
			return nil, "", nil, fmt.Errorf("cannot connect to %s: %w", target, err)
		}
		if db, err = gorm.Open(postgres.New(postgres.Config{Conn: pool}), cfg); err != nil {
			pool.Close()
			return nil, "", nil, fmt.Errorf("open %s: %w", target, err)
		}
		close = func() { pool.Close() }
	} else {
		kind = "sqlite"
		path, full := d, d
		if strings.HasPrefix(d, "sqlite:") {
			path = strings.TrimPrefix(d, "sqlite:")
			full = path
		}
		if strings.HasPrefix(path, "file:") {
			path, _, _ = strings.Cut(strings.TrimPrefix(path, "file:"), "?")
		} else {
			full = sqliteFileDSN(path)
		}
		if st, err := os.Stat(path); err != nil {
			return nil, "", nil, fmt.Errorf("SQLite database %s: %w (a Postgres DSN starts with postgres:// or has host=...)", path, err)
		} else if st.IsDir() {
			return nil, "", nil, fmt.Errorf("SQLite database %s is a directory", path)
		}
		if db, err = gorm.Open(openSQLite(full), cfg); err != nil {
			return nil, "", nil, fmt.Errorf("open SQLite database %s with %s: %w", path, sqliteDriver, err)
		}
		pool, err := db.DB()
		if err != nil {
			return nil, "", nil, fmt.Errorf("open SQLite database %s: %w", path, err)
		}
		close = func() { pool.Close() }
	}
	return db, kind, close, nil
}

// withStores checks that db has the module's tables, at this version's
// schema, and builds the stores verify-only (no DDL). With tenant (a
// Postgres schema: -schemas, -tenant) they are that schema's, named
// schema-qualified (WithSchema) whatever db's search_path, so that every
// tenant's stores share db's pool; close is then the tenant's to call
// (the pool's is the command's: resolveTenants).
func withStores(ctx context.Context, db *gorm.DB, kind, tenant string, close func()) (*database, error) {
	fail := func(err error) (*database, error) {
		close()
		return nil, err
	}
	if ok, err := hasTable(ctx, db, kind, tenant, "subscriber_checkpoints"); err != nil {
		return fail(fmt.Errorf("read the database's tables: %w", err))
	} else if !ok {
		return fail(errors.New("this database has no subscriber_checkpoints table: no subscriber ever ran here (is the DSN, or its search_path, right? " +
			"A new database gets the module's tables from `subscriptions migrate`)"))
	}
	// Verify once, for one message; the constructors verify again (and,
	// verify-only, would refuse rather than migrate were it to change).
	verify := migrations.Verify
	if tenant != "" {
		verify = func(ctx context.Context, db *gorm.DB) error { return migrations.VerifySchema(ctx, db, tenant) }
	}
	if err := verify(ctx, db); err != nil {
		return fail(schemaError(err))
	}
	out := &database{db: db, kind: kind, tenant: tenant, close: close}
	var storeOpts []subscriptions.GormStoreOption
	eventOpts := []infrastructure.GormEventStoreOption{infrastructure.WithSchemaVerifyOnly()}
	if tenant != "" {
		storeOpts = append(storeOpts, subscriptions.WithSchema(tenant))
		eventOpts = append(eventOpts, infrastructure.WithSchema(tenant))
	}
	var err error
	if out.events, err = infrastructure.NewGormEventStore(db, eventOpts...); err != nil {
		return fail(schemaError(err))
	}
	if out.checkpoints, err = subscriptions.NewGormCheckpointStore(db, append(storeOpts, subscriptions.WithSchemaVerifyOnly())...); err != nil {
		return fail(schemaError(err))
	}
	if out.parking, err = subscriptions.NewGormParkingLot(db, append(storeOpts, subscriptions.WithSchemaVerifyOnly())...); err != nil {
		return fail(schemaError(err))
	}
	return out, nil
}

// schemaError adds to a schema mismatch (migrations.ErrSchemaMismatch,
// whose message names each missing object and the file that adds it) that
// this command changed nothing and how to bring the schema up to date.
func schemaError(err error) error {
	if !errors.Is(err, migrations.ErrSchemaMismatch) {
		return err
	}
	return fmt.Errorf("%w\nthis command changes no schema, and changed nothing: apply the migrations with `subscriptions migrate` "+
		"(run by a role allowed to create tables; -verify checks them), then run it again", err)
}

// hasTable reports whether table exists: in schema on Postgres, or in
// the one the search_path selects when schema is "".
func hasTable(ctx context.Context, db *gorm.DB, kind, schema, table string) (bool, error) {
	var n int
	q, args := "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?", []any{table}
	if kind == "postgres" {
		q = "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = COALESCE(NULLIF(?, ''), current_schema()) AND tablename = ?"
		args = []any{schema, table}
	}
	err := db.WithContext(ctx).Raw(q, args...).Scan(&n).Error
	return n > 0, err
}

// subscriber is a Subscriber for g over the database's stores, with g's
// partitions. Its handler refuses to run: the CLI never processes events.
// Its log lines (the audit line of a discard, a reset) go to stderr, with
// the tenant when there is one.
func (d *database) subscriber(g *group, log *slog.Logger) (*subscriptions.Subscriber, error) {
	// WithOrderedParking: Status then counts held entries, whatever the
	// application's option (this Subscriber never runs).
	if d.tenant != "" {
		log = log.With("tenant", d.tenant)
	}
	opts := []subscriptions.SubscriberOption{subscriptions.WithParkingLot(d.parking), subscriptions.WithOrderedParking(), subscriptions.WithLogger(log)}
	if g.partitions > 0 {
		opts = append(opts, subscriptions.WithPartitions(g.partitions))
	}
	return subscriptions.NewSubscriber(g.name, d.events, d.checkpoints, func(context.Context, domain.EventEnvelope[any]) error {
		return errNoHandler
	}, opts...)
}
