package subscriptions_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/dbtest"
	"github.com/eventfeed/subscriptions/internal/feedtest"
)

// Shared helpers of the subscriber-core tests (subscriber_*, checkpoint_*,
// replicas_, reset_ and benchmark_ files). Everything is prefixed "core" so
// that it cannot collide with the other test files of the package.

// corePoll is the poll interval of the core tests: short, so that retries
// and idle polls do not slow the suite down.
const corePoll = 10 * time.Millisecond

// coreFeed returns every event of the store's feed, in feed order.
func coreFeed(t testing.TB, store domain.EventStore) []domain.EventEnvelope[any] {
	t.Helper()
	events, err := store.ReadAfter(context.Background(), 0, 0)
	require.NoError(t, err)
	return events
}

// coreIDs and corePositions are the shared feed helpers
// (internal/feedtest) under the core tests' names.
var (
	coreIDs       = feedtest.IDs
	corePositions = feedtest.Positions
)

// coreRecorder records what a handler saw, safe for concurrent use.
type coreRecorder struct {
	mu     sync.Mutex
	events []domain.EventEnvelope[any]
	tx     []bool // inBatchTx(ctx), per recorded event
}

func (r *coreRecorder) record(ctx context.Context, ev domain.EventEnvelope[any]) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
	r.tx = append(r.tx, inBatchTx(ctx))
}

func (r *coreRecorder) snapshot() []domain.EventEnvelope[any] {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]domain.EventEnvelope[any](nil), r.events...)
}

func (r *coreRecorder) ids() []string { return coreIDs(r.snapshot()) }

func (r *coreRecorder) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

func (r *coreRecorder) txSeen() []bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]bool(nil), r.tx...)
}

// coreNewSub creates a subscriber with the core defaults (quiet logger,
// corePoll) before opts.
func coreNewSub(t testing.TB, name string, events domain.EventStore, cps subscriptions.CheckpointStore, h subscriptions.Handler, opts ...subscriptions.SubscriberOption) *subscriptions.Subscriber {
	t.Helper()
	all := append([]subscriptions.SubscriberOption{subscriptions.WithLogger(quietLogger()), subscriptions.WithPollInterval(corePoll)}, opts...)
	sub, err := subscriptions.NewSubscriber(name, events, cps, h, all...)
	require.NoError(t, err)
	return sub
}

// coreGate blocks a handler at one event until released, telling the test
// when the handler arrived.
type coreGate struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func newCoreGate() *coreGate {
	return &coreGate{entered: make(chan struct{}, 1), release: make(chan struct{})}
}

// pass is called by the handler: it signals arrival and waits for release.
func (g *coreGate) pass() {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	<-g.release
}

// waitEntered waits (bounded) until a handler is at the gate.
func (g *coreGate) waitEntered(t testing.TB) {
	t.Helper()
	select {
	case <-g.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler never reached the gate")
	}
}

func (g *coreGate) open() { g.once.Do(func() { close(g.release) }) }

// coreProjection creates a projection table unique to the test and returns
// its name.
func coreProjection(t testing.TB, db *gorm.DB, prefix string) string {
	t.Helper()
	table := fmt.Sprintf("core_%s_%d", prefix, time.Now().UnixNano()%1_000_000_000)
	createProjection(t, db, table)
	return table
}

// coreGoroutineBlockedIn reports whether some goroutine whose stack
// contains fn is parked waiting on a channel or a condition: the tests use
// it to know that a call has reached its blocking point (e.g. a Reset
// waiting for a batch) without sleeping. A goroutine that is merely
// running through fn (or queued on a mutex on its way in) does not count:
// it may not have done what precedes the wait yet.
func coreGoroutineBlockedIn(fn string) bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	for _, g := range strings.Split(string(buf), "\n\n") {
		header, _, _ := strings.Cut(g, "\n")
		_, state, ok := strings.Cut(header, " [")
		if !ok || !strings.Contains(g, fn) {
			continue
		}
		for _, waiting := range []string{"select", "chan receive", "chan send", "sync.Cond.Wait", "sync.WaitGroup.Wait"} {
			if strings.HasPrefix(state, waiting) {
				return true
			}
		}
	}
	return false
}

// coreSchemaLockSQL selects the sessions holding a lock on a relation of
// the schema: the test's own sessions on a shared server.
const coreSchemaLockSQL = `SELECT l.pid FROM pg_locks l
	JOIN pg_class c ON c.oid = l.relation
	JOIN pg_namespace n ON n.oid = c.relnamespace
	WHERE n.nspname = ?`

// coreIdleInTx counts sessions that are idle in a transaction while holding
// a lock on a table of the test's schema: a leaked batch transaction.
func coreIdleInTx(t testing.TB, pg *dbtest.Postgres) int {
	t.Helper()
	var n int
	require.NoError(t, pg.DB.Raw(`SELECT count(*) FROM pg_stat_activity
		WHERE state LIKE 'idle in transaction%' AND pid IN (`+coreSchemaLockSQL+`)`, pg.Schema).Scan(&n).Error)
	return n
}

// coreLockWaiters counts sessions of the test's schema that wait for a
// lock (a Reset queued behind a batch's row lock).
func coreLockWaiters(t testing.TB, pg *dbtest.Postgres) int {
	t.Helper()
	var n int
	require.NoError(t, pg.DB.Raw(`SELECT count(*) FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND pid IN (`+coreSchemaLockSQL+`)`, pg.Schema).Scan(&n).Error)
	return n
}

// coreInUse is the number of connections of db's pool checked out.
func coreInUse(t testing.TB, db *gorm.DB) int {
	t.Helper()
	sqlDB, err := db.DB()
	require.NoError(t, err)
	return sqlDB.Stats().InUse
}

// coreEnvelope is the envelope type handlers receive.
type coreEnvelope = domain.EventEnvelope[any]
