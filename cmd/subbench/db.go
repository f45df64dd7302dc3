package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dsn"
	"github.com/eventfeed/subscriptions/internal/secret"
)

// bench is one run's shared state: the server, the schemas and files it
// created (removed by cleanup), and the pools of the running scenario.
type bench struct {
	cfg       config
	progress  io.Writer
	runID     string // subbench_<hex>: schema prefix and application_name
	pgVersion string
	scenario  string

	schemas []string
	tmpDirs []string
	pools   []func() error // closed after each scenario

	notes []string
	// libLogs counts the warnings and errors the library logged.
	libLogs atomic.Int64
}

func newBench(ctx context.Context, cfg config, progress io.Writer) (*bench, error) {
	raw := make([]byte, 4)
	_, _ = rand.Read(raw)
	b := &bench{cfg: cfg, progress: progress, runID: "subbench_" + hex.EncodeToString(raw)}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("connect to Postgres at %s: %w", secret.RedactDSN(cfg.DSN), err)
	}
	defer conn.Close(context.Background())
	var version string
	if err := conn.QueryRow(cctx, "SHOW server_version").Scan(&version); err != nil {
		return nil, fmt.Errorf("read the server version: %w", err)
	}
	b.pgVersion = "PostgreSQL " + version
	var fsync, syncCommit string
	_ = conn.QueryRow(cctx, "SELECT current_setting('fsync'), current_setting('synchronous_commit')").Scan(&fsync, &syncCommit)
	b.note(fmt.Sprintf("Postgres fsync=%s synchronous_commit=%s; run %s", fsync, syncCommit, b.runID))
	return b, nil
}

func (b *bench) note(s string) {
	if !slices.Contains(b.notes, s) {
		b.notes = append(b.notes, s)
	}
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.progress, "subbench:   "+format+"\n", args...)
}

// newSchema creates a fresh schema for one scenario and returns a DSN that
// selects it (search_path) and names this run (application_name).
func (b *bench) newSchema(ctx context.Context, name string) (string, error) {
	schema := b.runID + "_" + name
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, b.cfg.DSN)
	if err != nil {
		return "", fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	b.schemas = append(b.schemas, schema) // dropped even if creation half-failed
	if _, err := conn.Exec(cctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return "", fmt.Errorf("create schema %s: %w", schema, err)
	}
	u, err := url.Parse(b.cfg.DSN)
	if err != nil {
		return "", fmt.Errorf("the DSN must be a URL: %w", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	q.Set("application_name", b.runID)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// newPGStore is the set-up every Postgres scenario starts from: a fresh
// schema (newSchema), a pool of maxConns on it (openPG) and an event store
// on that pool, whose constructor applies the module's migrations. The
// pool and the schema are released with the bench.
func (b *bench) newPGStore(ctx context.Context, name string, maxConns int) (string, *gorm.DB, *infrastructure.GormEventStore, error) {
	dsn, err := b.newSchema(ctx, name)
	if err != nil {
		return "", nil, nil, err
	}
	db, err := b.openPG(dsn, maxConns, nil)
	if err != nil {
		return "", nil, nil, err
	}
	store, err := infrastructure.NewGormEventStore(db)
	if err != nil {
		return "", nil, nil, err
	}
	return dsn, db, store, nil
}

// execAll runs a scenario's set-up statements (projection tables,
// ANALYZE) in order, stopping at the first that fails.
func execAll(db *gorm.DB, stmts ...string) error {
	for _, stmt := range stmts {
		if err := db.Exec(stmt).Error; err != nil {
			return fmt.Errorf("set up: %w", err)
		}
	}
	return nil
}

// openPG opens a GORM pool on dsn through pgx's database/sql driver, with
// an optional query tracer (statement counting at the driver). maxConns
// bounds the pool; idle connections are kept up to the same number, so
// that no scenario measures connection churn.
func (b *bench) openPG(dsn string, maxConns int, tracer pgx.QueryTracer) (*gorm.DB, error) {
	return b.openPGAs(dsn, "", maxConns, tracer)
}

// openPGAs is openPG with the pool's sessions named application_name
// runID_app, so that their backends can be told apart.
func (b *bench) openPGAs(dsn, app string, maxConns int, tracer pgx.QueryTracer) (*gorm.DB, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse DSN: %w", err)
	}
	if app != "" {
		cfg.RuntimeParams["application_name"] = b.runID + "_" + app
	}
	if tracer != nil {
		cfg.Tracer = tracer
	}
	sqlDB := stdlib.OpenDB(*cfg)
	sqlDB.SetMaxOpenConns(maxConns)
	sqlDB.SetMaxIdleConns(maxConns)
	b.pools = append(b.pools, sqlDB.Close)
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return nil, fmt.Errorf("open gorm: %w", err)
	}
	return db, nil
}

// openSQLite opens a SQLite file database (the DSN the module documents:
// WAL, busy timeout, immediate transactions) in a temporary directory.
func (b *bench) openSQLite(name string) (*gorm.DB, error) {
	dir, err := os.MkdirTemp("", b.runID+"_")
	if err != nil {
		return nil, err
	}
	b.tmpDirs = append(b.tmpDirs, dir)
	db, err := gorm.Open(sqlite.Open(dsn.SQLiteFile(filepath.Join(dir, name+".db"))), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return nil, fmt.Errorf("open sqlite: %w", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	sqlDB.SetMaxIdleConns(8)
	b.pools = append(b.pools, sqlDB.Close)
	return db, nil
}

// closePools closes the pools the last scenario opened.
func (b *bench) closePools() { b.closePoolsFrom(0) }

// closePoolsFrom closes the pools opened since len(b.pools) was mark, the
// latest first.
func (b *bench) closePoolsFrom(mark int) {
	for i := len(b.pools) - 1; i >= mark; i-- {
		_ = b.pools[i]()
	}
	b.pools = b.pools[:mark]
}

// casePools is for a scenario of many cases, each opening pools of its
// own: the returned func closes the pools opened since the call, so that
// the cases' idle connections do not add up to the server's
// max_connections (13 partition cases kept ~100 open).
func (b *bench) casePools() (closeCase func()) {
	mark := len(b.pools)
	return func() { b.closePoolsFrom(mark) }
}

// cleanup closes every pool, ends any session of this run still open,
// drops the run's schemas and removes its files. It runs on a context of
// its own: it must also work after an interrupt.
func (b *bench) cleanup() error {
	b.closePools()
	var errs []error
	for _, dir := range b.tmpDirs {
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
	}
	b.tmpDirs = nil
	if len(b.schemas) == 0 {
		return errors.Join(errs...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, b.cfg.DSN)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("cleanup: connect: %w (schemas %v are left behind)", err, b.schemas))...)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE (application_name = $1 OR starts_with(application_name, $1 || '_')) AND pid <> pg_backend_pid()", b.runID); err != nil {
		errs = append(errs, fmt.Errorf("cleanup: end sessions: %w", err))
	}
	for _, s := range b.schemas {
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{s}.Sanitize()+" CASCADE"); err != nil {
			errs = append(errs, fmt.Errorf("cleanup: drop schema %s: %w", s, err))
		}
	}
	b.schemas = nil
	return errors.Join(errs...)
}

// libLogger is the logger handed to the library. Warnings and errors are
// counted (and reported as a note); with -v they are printed too.
func (b *bench) libLogger() *slog.Logger {
	var inner slog.Handler = slog.DiscardHandler
	if b.cfg.Verbose {
		inner = slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})
	}
	return slog.New(&countingHandler{inner: inner, n: &b.libLogs})
}

type countingHandler struct {
	inner slog.Handler
	n     *atomic.Int64
}

func (h *countingHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn
}

func (h *countingHandler) Handle(ctx context.Context, r slog.Record) error {
	h.n.Add(1)
	if h.inner.Enabled(ctx, r.Level) {
		return h.inner.Handle(ctx, r)
	}
	return nil
}

func (h *countingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &countingHandler{inner: h.inner.WithAttrs(attrs), n: h.n}
}

func (h *countingHandler) WithGroup(name string) slog.Handler {
	return &countingHandler{inner: h.inner.WithGroup(name), n: h.n}
}

// backendCPU returns the CPU time (user+system) used so far by each
// backend whose application_name is runID_app, read from /proc: it works
// when the server runs on this machine (nil otherwise).
func (b *bench) backendCPU(ctx context.Context, app string) map[int]time.Duration {
	conn, err := pgx.Connect(ctx, b.cfg.DSN)
	if err != nil {
		return nil
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1", b.runID+"_"+app)
	if err != nil {
		return nil
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil
	}
	out := map[int]time.Duration{}
	for _, pid := range pids {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return nil // not on this machine
		}
		// Fields after the command name (which may contain spaces).
		f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
		if len(f) < 13 {
			return nil
		}
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		out[int(pid)] = time.Duration(utime+stime) * time.Second / clockTicks
	}
	return out
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times (100 on Linux).
const clockTicks = 100

// cpuDelta is the CPU used between two backendCPU snapshots.
func cpuDelta(before, after map[int]time.Duration) (time.Duration, bool) {
	if before == nil || after == nil {
		return 0, false
	}
	var d time.Duration
	for pid, t := range after {
		d += t - before[pid]
	}
	return d, true
}
