package subscriptions_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/migrations/schema"
	"github.com/eventfeed/subscriptions/pgxstore"
)

// env is one backend's wiring for behavioural tests: an event store, a
// checkpoint store and a parking lot, over one database (nil DB: memory).
// On the pgx backend the stores are pgxstore's, on Pgx, and DB is a GORM
// pool on the same schema for the tests' own SQL outside handlers; a
// handler writes through e.Exec (or e.project), which takes the batch
// transaction of whichever kind the backend hands it.
type env struct {
	Name        string
	DB          *gorm.DB // nil for the memory backend
	PG          *dbtest.Postgres
	Pgx         *pgxpool.Pool // the pgx backend's pool; nil otherwise
	Events      domain.EventStore
	Checkpoints subscriptions.CheckpointStore
	Parking     subscriptions.ParkingLot
}

// Postgres reports whether the env runs on Postgres.
func (e *env) Postgres() bool { return e.PG != nil }

// envBackend names a backend and builds a fresh env for one test.
type envBackend struct {
	Name     string
	New      func(t *testing.T) *env
	Postgres bool // New returns a Postgres env (GORM's or pgx's)
}

// envBackends lists memory, SQLite (memory and file), Postgres on GORM
// and Postgres on pgx (pgxstore). Run a behavioural test as
// `for _, b := range envBackends() { t.Run(b.Name, ...) }`.
func envBackends() []envBackend {
	out := []envBackend{{Name: "memory", New: func(t *testing.T) *env {
		return &env{
			Name:        "memory",
			Events:      infrastructure.NewMemoryStore(),
			Checkpoints: subscriptions.NewMemoryCheckpointStore(),
			Parking:     subscriptions.NewMemoryParkingLot(),
		}
	}}}
	for _, b := range dbtest.GormBackends() {
		b := b
		out = append(out, envBackend{Name: b.Name, Postgres: b.Postgres, New: func(t *testing.T) *env {
			var db *gorm.DB
			var pg *dbtest.Postgres
			if b.Postgres {
				pg = dbtest.NewPostgres(t)
				db = pg.DB
			} else {
				db = b.Open(t)
			}
			return gormEnv(t, b.Name, db, pg)
		}})
	}
	return append(out, pgxBackend)
}

// pgxBackend is the pgx backend alone (the last of envBackends).
var pgxBackend = envBackend{Name: "pgx", New: pgxEnv, Postgres: true}

// pgxEnv is the pgx backend: pgxstore's three stores on a pgx pool over a
// fresh Postgres schema, with a GORM pool on the same schema as DB.
func pgxEnv(t *testing.T) *env {
	t.Helper()
	pg := dbtest.NewPostgres(t)
	return pgxEnvOn(t, pg, pg.OpenPgx(t))
}

// pgxEnvOn is pgxstore's three stores on pool, a pool on pg's schema.
func pgxEnvOn(t *testing.T, pg *dbtest.Postgres, pool *pgxpool.Pool) *env {
	t.Helper()
	ctx := context.Background()
	events, err := pgxstore.NewEventStore(ctx, pool)
	require.NoError(t, err)
	cps, err := pgxstore.NewCheckpointStore(ctx, pool)
	require.NoError(t, err)
	lot, err := pgxstore.NewParkingLot(ctx, pool)
	require.NoError(t, err)
	return &env{Name: "pgx", DB: pg.DB, PG: pg, Pgx: pool, Events: events, Checkpoints: cps, Parking: lot}
}

// errNoBatchTx is what e.Exec returns outside a batch transaction.
var errNoBatchTx = errors.New("no batch transaction in the handler's context")

// Exec runs query, written with ? placeholders, in the batch transaction
// of the handler's ctx: through subscriptions.TxFromContext on the GORM
// backends, through pgxstore.TxFromContext (the placeholders rebound to
// $n) on the pgx backend. Without one (memory, or outside a handler) it
// returns errNoBatchTx.
func (e *env) Exec(ctx context.Context, query string, args ...any) error {
	if e.Pgx != nil {
		tx := pgxstore.TxFromContext(ctx)
		if tx == nil {
			return errNoBatchTx
		}
		_, err := tx.Exec(ctx, schema.Rebind(query), args...)
		return err
	}
	tx := subscriptions.TxFromContext(ctx)
	if tx == nil {
		return errNoBatchTx
	}
	return tx.Exec(query, args...).Error
}

// row is the one-row result of e.QueryRow: *sql.Row and pgx.Row both are.
type row interface{ Scan(dest ...any) error }

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// QueryRow runs query (? placeholders) in the handler's batch
// transaction, as Exec does, and returns its first row.
func (e *env) QueryRow(ctx context.Context, query string, args ...any) row {
	if e.Pgx != nil {
		tx := pgxstore.TxFromContext(ctx)
		if tx == nil {
			return errRow{errNoBatchTx}
		}
		return tx.QueryRow(ctx, schema.Rebind(query), args...)
	}
	tx := subscriptions.TxFromContext(ctx)
	if tx == nil {
		return errRow{errNoBatchTx}
	}
	return tx.Raw(query, args...).Row()
}

// InTx reports whether ctx carries the backend's batch transaction.
func (e *env) InTx(ctx context.Context) bool {
	if e.Pgx != nil {
		return pgxstore.TxFromContext(ctx) != nil
	}
	return subscriptions.TxFromContext(ctx) != nil
}

// project writes ev into table through the handler's batch transaction
// (Exec).
func (e *env) project(ctx context.Context, table string, ev domain.EventEnvelope[any]) error {
	return e.Exec(ctx, "INSERT INTO "+table+" (event_id, position) VALUES (?, ?)", ev.ID, ev.Position)
}

// inUse is the number of connections of the stores' pool checked out:
// the pgx pool's on the pgx backend, DB's otherwise.
func (e *env) inUse(t testing.TB) int {
	t.Helper()
	if e.Pgx != nil {
		return int(e.Pgx.Stat().AcquiredConns())
	}
	return coreInUse(t, e.DB)
}

// closePool closes the pool the stores run on (the pgx pool on pgx,
// DB's otherwise), as a database gone away would leave them.
func (e *env) closePool(t testing.TB) {
	t.Helper()
	if e.Pgx != nil {
		e.Pgx.Close()
		return
	}
	sqlDB, err := e.DB.DB()
	require.NoError(t, err)
	require.NoError(t, sqlDB.Close())
}

// reopen returns an event store and a checkpoint store of e's backend on
// a new pool of its database, as a restarted process would have them: on
// Postgres (GORM or pgx) a new pool and both stores, on SQLite both
// stores anew on DB (the database is the connection), in memory the
// same stores.
func (e *env) reopen(t testing.TB) (domain.EventStore, subscriptions.CheckpointStore) {
	t.Helper()
	switch {
	case e.Pgx != nil:
		ctx := context.Background()
		pool := e.PG.OpenPgx(t)
		events, err := pgxstore.NewEventStore(ctx, pool)
		require.NoError(t, err)
		cps, err := pgxstore.NewCheckpointStore(ctx, pool)
		require.NoError(t, err)
		return events, cps
	case e.Postgres():
		db := e.PG.Open(t)
		events, err := infrastructure.NewGormEventStore(db)
		require.NoError(t, err)
		cps, err := subscriptions.NewGormCheckpointStore(db)
		require.NoError(t, err)
		return events, cps
	case e.DB != nil:
		events, err := infrastructure.NewGormEventStore(e.DB)
		require.NoError(t, err)
		cps, err := subscriptions.NewGormCheckpointStore(e.DB)
		require.NoError(t, err)
		return events, cps
	}
	return e.Events, e.Checkpoints
}

// freshCheckpoints returns a new checkpoint store of e's backend on its
// database and pool, as a process restarted with the same pool
// configuration would have it; the memory backend has none (its
// checkpoints live in the store).
func (e *env) freshCheckpoints(t testing.TB) subscriptions.CheckpointStore {
	t.Helper()
	var cps subscriptions.CheckpointStore
	var err error
	switch {
	case e.Pgx != nil:
		cps, err = pgxstore.NewCheckpointStore(context.Background(), e.Pgx)
	case e.DB != nil:
		cps, err = subscriptions.NewGormCheckpointStore(e.DB)
	default:
		t.Fatal("freshCheckpoints: the memory backend keeps its checkpoints in its store")
	}
	require.NoError(t, err)
	return cps
}

// inBatchTx reports whether ctx carries a batch transaction of either
// kind (GORM's or pgxstore's), for helpers that know no env.
func inBatchTx(ctx context.Context) bool {
	return subscriptions.TxFromContext(ctx) != nil || pgxstore.TxFromContext(ctx) != nil
}

// gooseEnvBackends lists SQLite files and Postgres schemas whose schema
// goose applied from migrations.FS, empty or over the original module's
// tables, with stores built by the verify-only constructors (no DDL of
// their own): suites run on them too, to show that the migration files
// alone give the module what it needs.
func gooseEnvBackends() []envBackend {
	var out []envBackend
	for _, original := range []bool{false, true} {
		for _, postgres := range []bool{false, true} {
			name := "sqlite-file-goose"
			if postgres {
				name = "postgres-goose"
			}
			if original {
				name = strings.Replace(name, "-goose", "-original-goose", 1)
			}
			out = append(out, envBackend{Name: name, New: func(t *testing.T) *env {
				var db *gorm.DB
				var pg *dbtest.Postgres
				if postgres {
					pg = dbtest.NewPostgres(t)
					db = pg.DB
				} else {
					db = dbtest.NewSQLiteFile(t)
				}
				if original {
					dbtest.CreateOriginalSchema(t, db, false)
				}
				dbtest.ApplyWithGoose(t, db)
				events, err := infrastructure.NewGormEventStore(db, infrastructure.WithSchemaVerifyOnly())
				require.NoError(t, err)
				cps, err := subscriptions.NewGormCheckpointStore(db, subscriptions.WithSchemaVerifyOnly())
				require.NoError(t, err)
				lot, err := subscriptions.NewGormParkingLot(db, subscriptions.WithSchemaVerifyOnly())
				require.NoError(t, err)
				return &env{Name: name, DB: db, PG: pg, Events: events, Checkpoints: cps, Parking: lot}
			}})
		}
	}
	return out
}

// dbEnvs lists the database backends: gormEnvs and pgx.
func dbEnvs() []envBackend { return envBackends()[1:] }

// gormEnvs lists only the GORM database backends (SQLite memory, file,
// Postgres): for tests of the GORM stores' own API.
func gormEnvs() []envBackend {
	b := envBackends()
	return b[1 : len(b)-1]
}

func gormEnv(t *testing.T, name string, db *gorm.DB, pg *dbtest.Postgres) *env {
	t.Helper()
	events, err := infrastructure.NewGormEventStore(db)
	require.NoError(t, err)
	cps, err := subscriptions.NewGormCheckpointStore(db)
	require.NoError(t, err)
	lot, err := subscriptions.NewGormParkingLot(db)
	require.NoError(t, err)
	return &env{Name: name, DB: db, PG: pg, Events: events, Checkpoints: cps, Parking: lot}
}

// appendN appends n events of type eventType, spread over three aggregates,
// with payload {"n": i} for i counting from first; it returns their IDs in
// append order.
func appendN(t testing.TB, store domain.EventStore, eventType string, first, n int) []string {
	t.Helper()
	ids := make([]string, 0, n)
	for i := first; i < first+n; i++ {
		ev := domain.NewEventEnvelope[any](map[string]any{"n": i}, fmt.Sprintf("agg-%d", i%3), eventType, 0)
		require.NoError(t, store.Append(context.Background(), ev.AggregateID, -1, ev))
		ids = append(ids, ev.ID)
	}
	return ids
}

// createProjection creates a projection table keyed by event ID: the
// primary key makes a duplicate write fail, which proves exactly-once.
func createProjection(t testing.TB, db *gorm.DB, table string) {
	t.Helper()
	require.NoError(t, db.Exec("CREATE TABLE "+table+" (event_id text PRIMARY KEY, position bigint NOT NULL)").Error)
}

// project writes ev into table through the batch transaction.
func project(ctx context.Context, table string, ev domain.EventEnvelope[any]) error {
	tx := subscriptions.TxFromContext(ctx)
	if tx == nil {
		return fmt.Errorf("no batch transaction in the handler's context")
	}
	return tx.Exec("INSERT INTO "+table+" (event_id, position) VALUES (?, ?)", ev.ID, ev.Position).Error
}

// projectSQL is project through the batch transaction's database/sql
// handle (SQLTxFromContext), with plain placeholders.
func projectSQL(ctx context.Context, table string, ev domain.EventEnvelope[any]) error {
	tx := subscriptions.SQLTxFromContext(ctx)
	if tx == nil {
		return fmt.Errorf("no batch transaction in the handler's context")
	}
	_, err := tx.ExecContext(ctx, "INSERT INTO "+table+" (event_id, position) VALUES ($1, $2)", ev.ID, ev.Position)
	return err
}

// projector is one way a handler writes ev into table through the batch
// transaction of e's backend.
type projector struct {
	Name    string
	Project func(e *env, ctx context.Context, table string, ev domain.EventEnvelope[any]) error
}

// projectors are the two ways a handler writes through the batch
// transaction of a GORM backend; exactly-once tests run with each, and
// with pgxProjector on the pgx backend.
var projectors = []projector{
	{"gorm", func(_ *env, ctx context.Context, table string, ev domain.EventEnvelope[any]) error {
		return project(ctx, table, ev)
	}},
	{"database-sql", func(_ *env, ctx context.Context, table string, ev domain.EventEnvelope[any]) error {
		return projectSQL(ctx, table, ev)
	}},
}

// pgxProjector writes through pgxstore.TxFromContext (e.project).
var pgxProjector = projector{"pgx", (*env).project}

// projected returns the event IDs in table ordered by position.
func projected(t testing.TB, db *gorm.DB, table string) []string {
	t.Helper()
	var ids []string
	require.NoError(t, db.Raw("SELECT event_id FROM "+table+" ORDER BY position").Scan(&ids).Error)
	return ids
}

// running is a Subscriber's Run on a goroutine, started by start: the one
// way the root tests run a subscriber in the background. A panic in Run is
// recovered and reported as the result.
type running struct {
	cancel  context.CancelFunc
	done    chan runResult // holds the result once Run returned; readers put it back
	checked atomic.Bool    // a test has looked at the result (wait or stop)
}

// runResult is how Run ended.
type runResult struct {
	err      error
	panicked bool
	panicVal any
}

// start runs sub.Run on a goroutine until cancel or stop, or the test's
// cleanup, which cancels it, waits (bounded) for the goroutine to end
// (goleak) and, unless the test looked at the result itself, requires
// that Run returned nil without panicking.
func start(t testing.TB, sub *subscriptions.Subscriber) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan runResult, 1)}
	go func() {
		var res runResult
		defer func() {
			if v := recover(); v != nil {
				res.panicked, res.panicVal = true, v
			}
			r.done <- res
		}()
		res.err = sub.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case res := <-r.done:
			r.done <- res
			if r.checked.Load() {
				return
			}
			if res.panicked {
				t.Errorf("Run panicked: %v", res.panicVal)
			} else if res.err != nil {
				t.Errorf("Run returned %v, want nil after cancellation", res.err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("Run did not return within 30s of the test's end")
		}
	})
	return r
}

// wait waits (bounded) for Run to return and returns its result.
func (r *running) wait(t testing.TB) runResult {
	t.Helper()
	select {
	case res := <-r.done:
		r.done <- res // keep it for the cleanup and later readers
		r.checked.Store(true)
		return res
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s")
		return runResult{}
	}
}

// stop cancels Run and requires it to return nil without panicking.
func (r *running) stop(t testing.TB) {
	t.Helper()
	r.cancel()
	res := r.wait(t)
	require.False(t, res.panicked, "Run panicked: %v", res.panicVal)
	require.NoError(t, res.err)
}

// returned reports whether Run has returned, without waiting.
func (r *running) returned() bool {
	select {
	case res := <-r.done:
		r.done <- res
		return true
	default:
		return false
	}
}

// waitCaughtUp waits until the subscriber's lag is 0.
func waitCaughtUp(t testing.TB, sub *subscriptions.Subscriber) {
	t.Helper()
	require.Eventually(t, func() bool {
		lag, err := sub.Lag(context.Background())
		return err == nil && lag == 0
	}, 30*time.Second, 5*time.Millisecond, "subscriber %q did not catch up", sub.Name())
}

// logBuffer captures a subscriber's log output for assertions; safe for
// concurrent writes.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// newLogger returns a text logger at debug level writing to a logBuffer.
func newLogger() (*slog.Logger, *logBuffer) {
	buf := &logBuffer{}
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})), buf
}

// quietLogger discards everything; for tests that don't read the logs.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(discard{}, nil))
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
