// Package dbtest is the shared test harness for real databases: every
// package's tests get their Postgres and SQLite handles from here so that
// schema isolation, skipping rules and DSNs are the same everywhere.
//
// Postgres is reached through SUBSCRIPTIONS_POSTGRES_DSN (default
// DefaultPostgresDSN). Each test gets a fresh schema, selected through the
// search_path connection parameter and dropped at cleanup. When no server
// answers the test is skipped with a message naming the variable, unless
// SUBSCRIPTIONS_REQUIRE_POSTGRES=1, when it fails instead: CI sets that so
// the guarantees that live in Postgres can never silently go untested.
package dbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	glebarez "github.com/glebarez/sqlite"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/eventfeed/subscriptions/internal/dsn"
	"github.com/eventfeed/subscriptions/internal/secret"
)

const (
	// DSNEnv names the variable holding the Postgres DSN for tests.
	DSNEnv = dsn.PostgresEnv
	// RequireEnv, set to 1, turns "no Postgres server" into a test failure.
	RequireEnv = "SUBSCRIPTIONS_REQUIRE_POSTGRES"
	// DefaultPostgresDSN is used when DSNEnv is unset.
	DefaultPostgresDSN = dsn.DefaultPostgres
)

// PostgresDSN returns the configured base DSN (no schema selected).
func PostgresDSN() string { return dsn.Postgres() }

// Postgres is one test's isolated schema on the test server.
type Postgres struct {
	// Schema is the test's own schema, dropped at cleanup.
	Schema string
	// DSN selects Schema through search_path; hand it to anything that
	// opens its own connection (a listener, a child process, a second pool).
	DSN string
	// DB is a pool on DSN, closed at cleanup.
	DB *gorm.DB
	// server is the DSN of the server the schema is on (no schema
	// selected): "" for the test server, PostgresDSN.
	server string
}

// serverDSN is the DSN of the server p's schema is on.
func (p *Postgres) serverDSN() string {
	if p.server != "" {
		return p.server
	}
	return PostgresDSN()
}

var (
	reachOnce sync.Once
	reachErr  error
)

// reachable checks once per process whether the server answers, so that a
// missing server costs one connect timeout rather than one per test.
func reachable() error {
	reachOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, PostgresDSN())
		if err != nil {
			reachErr = err
			return
		}
		reachErr = conn.Ping(ctx)
		_ = conn.Close(ctx)
	})
	return reachErr
}

// RequirePostgres skips (or, with SUBSCRIPTIONS_REQUIRE_POSTGRES=1, fails)
// the test when the Postgres server does not answer.
func RequirePostgres(t testing.TB) {
	t.Helper()
	if err := reachable(); err != nil {
		msg := fmt.Sprintf("Postgres not reachable at %s (set %s to a reachable server): %v",
			secret.RedactDSN(PostgresDSN()), DSNEnv, err)
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("%s; %s=1 requires it", msg, RequireEnv)
		}
		t.Skip(msg)
	}
}

// NewPostgres creates a fresh schema for the test and returns a pool whose
// connections use it. The schema and pool are removed at cleanup.
func NewPostgres(t testing.TB) *Postgres {
	t.Helper()
	RequirePostgres(t)
	schema := "t_" + randomHex(8)
	createSchemas(t, schema)
	return openOnSchema(t, schema)
}

// openOnSchema opens the pool of NewPostgres on schema.
func openOnSchema(t testing.TB, schema string) *Postgres {
	t.Helper()
	dsn, err := WithSearchPath(PostgresDSN(), schema)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	pg := &Postgres{Schema: schema, DSN: dsn}
	pg.DB = pg.Open(t)
	return pg
}

// Open returns a new, separate pool on the test's schema, as another
// process would have. It is closed at cleanup.
func (p *Postgres) Open(t testing.TB) *gorm.DB {
	t.Helper()
	return OpenPostgresDSN(t, p.DSN)
}

// OpenPostgresDSN opens a pool on dsn that is closed at cleanup.
func OpenPostgresDSN(t testing.TB, dsn string) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(postgres.Open(dsn), quietConfig())
	if err != nil {
		t.Fatalf("dbtest: open postgres: %v", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	sqlDB.SetMaxOpenConns(8)
	t.Cleanup(func() { _ = sqlDB.Close() })
	return db
}

// DropSchema drops a test schema, terminating sessions still using it so
// that a leaked connection cannot make cleanup hang.
func DropSchema(t testing.TB, schema string) { dropSchemas(t, schema) }

// createSchemas creates the schemas on one connection and drops them at
// cleanup, in one statement.
func createSchemas(t testing.TB, schemas ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, PostgresDSN())
	if err != nil {
		t.Fatalf("dbtest: connect: %v", err)
	}
	defer admin.Close(context.Background())
	t.Cleanup(func() { dropSchemas(t, schemas...) }) // IF EXISTS: also after a failed create
	for _, schema := range schemas {
		if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
			t.Fatalf("dbtest: create schema %q: %v", schema, err)
		}
	}
}

func dropSchemas(t testing.TB, schemas ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, PostgresDSN())
	if err != nil {
		t.Errorf("dbtest: connect for cleanup of %q: %v", schemas, err)
		return
	}
	defer admin.Close(context.Background())
	quoted := make([]string, len(schemas))
	for i, schema := range schemas {
		quoted[i] = pgx.Identifier{schema}.Sanitize()
	}
	if _, err := admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+strings.Join(quoted, ", ")+" CASCADE"); err != nil {
		t.Errorf("dbtest: drop schemas %q: %v", schemas, err)
	}
}

// WithSearchPath returns dsn with its search_path parameter set to schema
// (a quoted identifier, schema.QuoteIdent, for a name that needs quoting).
func WithSearchPath(dsn, schema string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", fmt.Errorf("dbtest: %s must be a URL DSN: %w", DSNEnv, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	// pgx reads a + in the query as itself, not as a space: spell spaces
	// %20 (Encode writes a + of the value as %2B).
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
	return u.String(), nil
}

// SQLiteDriver is one GORM SQLite driver the module is tested with, and
// the DSNs that configure it as README documents.
type SQLiteDriver struct {
	// Name is "mattn" (gorm.io/driver/sqlite, cgo) or "glebarez"
	// (github.com/glebarez/sqlite, pure Go).
	Name string
	// Open returns the driver's GORM dialector for dsn.
	Open func(dsn string) gorm.Dialector
	// FileDSN and MemoryDSN spell the documented settings in the driver's
	// own DSN syntax (the two drivers read different parameters).
	FileDSN   func(path string) string
	MemoryDSN func(name string) string
}

// Mattn is gorm.io/driver/sqlite (github.com/mattn/go-sqlite3, cgo).
var Mattn = SQLiteDriver{Name: "mattn", Open: sqlite.Open, FileDSN: SQLiteFileDSN, MemoryDSN: SQLiteMemoryDSN}

// Glebarez is github.com/glebarez/sqlite (modernc.org/sqlite, pure Go),
// the driver the original module's users run.
var Glebarez = SQLiteDriver{
	Name:    "glebarez",
	Open:    glebarez.Open,
	FileDSN: dsn.SQLiteFileGlebarez,
	MemoryDSN: func(name string) string {
		return "file:/" + name + "?vfs=memdb&_pragma=busy_timeout(10000)&_txlock=immediate"
	},
}

// SQLiteDrivers lists every SQLite driver the suites run on.
func SQLiteDrivers() []SQLiteDriver { return []SQLiteDriver{Mattn, Glebarez} }

// SQLiteFileDSN is the DSN this module documents for a SQLite file database
// with gorm.io/driver/sqlite (see dsn.SQLiteFile).
func SQLiteFileDSN(path string) string { return dsn.SQLiteFile(path) }

// SQLiteMemoryDSN is an in-memory database named name (unique per
// database). Open it with a single connection (SetMaxOpenConns(1)): SQLite's
// in-memory databases lock the whole database for a writer, readers
// included, so a second connection would only wait; and the database lives
// as long as its connection does.
func SQLiteMemoryDSN(name string) string {
	return "file:/" + name + "?vfs=memdb&_busy_timeout=10000&_txlock=immediate"
}

// NewSQLiteFile opens a SQLite file database in the test's temp directory.
func NewSQLiteFile(t testing.TB) *gorm.DB { return Mattn.NewFile(t) }

// NewSQLiteMemory opens a fresh in-memory SQLite database on a single
// connection.
func NewSQLiteMemory(t testing.TB) *gorm.DB { return Mattn.NewMemory(t) }

// NewFile opens a SQLite file database in the test's temp directory.
func (d SQLiteDriver) NewFile(t testing.TB) *gorm.DB {
	t.Helper()
	return d.OpenDSN(t, d.FileDSN(filepath.Join(t.TempDir(), "test.db")))
}

// NewMemory opens a fresh in-memory SQLite database on a single
// connection.
func (d SQLiteDriver) NewMemory(t testing.TB) *gorm.DB {
	t.Helper()
	db := d.OpenDSN(t, d.MemoryDSN("mem_"+randomHex(8)))
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	sqlDB.SetMaxOpenConns(1)
	return db
}

// OpenSQLite opens dsn with gorm.io/driver/sqlite; closed at cleanup.
func OpenSQLite(t testing.TB, dsn string) *gorm.DB {
	t.Helper()
	return Mattn.OpenDSN(t, dsn)
}

// OpenDSN opens dsn with the driver; the pool is closed at cleanup.
func (d SQLiteDriver) OpenDSN(t testing.TB, dsn string) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(d.Open(dsn), quietConfig())
	if err != nil {
		t.Fatalf("dbtest: open sqlite (%s) %s: %v", d.Name, dsn, err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	t.Cleanup(func() { _ = sqlDB.Close() })
	return db
}

func quietConfig() *gorm.Config {
	return &gorm.Config{Logger: logger.Discard}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// OpenPgx returns a new pgx pool on the test's schema, as another process
// would have (at most 8 connections, like Open's), closed at cleanup.
func (p *Postgres) OpenPgx(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return OpenPgxDSN(t, p.DSN)
}

// OpenPgxDSN opens a pgx pool on dsn (at most 8 connections) that is
// closed at cleanup.
func OpenPgxDSN(t testing.TB, dsn string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("dbtest: parse dsn: %v", err)
	}
	cfg.MaxConns = 8
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("dbtest: open pgx pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}
