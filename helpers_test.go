package subscriptions_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// env is one backend's wiring for behavioural tests: an event store, a
// checkpoint store and a parking lot, over one database (nil DB: memory).
type env struct {
	Name        string
	DB          *gorm.DB // nil for the memory backend
	PG          *dbtest.Postgres
	Events      domain.EventStore
	Checkpoints subscriptions.CheckpointStore
	Parking     subscriptions.ParkingLot
}

// Postgres reports whether the env runs on Postgres.
func (e *env) Postgres() bool { return e.PG != nil }

// envBackend names a backend and builds a fresh env for one test.
type envBackend struct {
	Name string
	New  func(t *testing.T) *env
}

// envBackends lists memory, SQLite (memory and file) and Postgres. Run a
// behavioural test as `for _, b := range envBackends() { t.Run(b.Name, ...) }`.
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
		out = append(out, envBackend{Name: b.Name, New: func(t *testing.T) *env {
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
	return out
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

// gormEnvs lists only the database backends (SQLite memory, file, Postgres).
func gormEnvs() []envBackend { return envBackends()[1:] }

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

// projectors are the two ways a handler writes through the batch
// transaction; exactly-once tests run with each.
var projectors = []struct {
	Name    string
	Project func(ctx context.Context, table string, ev domain.EventEnvelope[any]) error
}{
	{"gorm", project},
	{"database-sql", projectSQL},
}

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
