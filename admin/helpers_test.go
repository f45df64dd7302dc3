package admin_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/admin"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// The admin tests' own wiring: the root package's test helpers are not
// importable, so the few the admin tests need are kept here, smaller.

// env is one backend's stores for a test: an event store, a checkpoint
// store and a parking lot over one database (or in memory).
type env struct {
	Name    string
	Events  domain.EventStore
	Cps     subscriptions.CheckpointStore
	Parking subscriptions.ParkingLot
}

// envBackend names a backend and builds a fresh env for one test.
type envBackend struct {
	Name string
	New  func(t *testing.T) *env
}

// envBackends lists memory, SQLite (memory, file, the pure-Go driver's
// file) and Postgres.
func envBackends() []envBackend {
	out := []envBackend{{Name: "memory", New: func(*testing.T) *env {
		return &env{Name: "memory", Events: infrastructure.NewMemoryStore(),
			Cps: subscriptions.NewMemoryCheckpointStore(), Parking: subscriptions.NewMemoryParkingLot()}
	}}}
	for _, b := range dbtest.GormBackends() {
		out = append(out, envBackend{Name: b.Name, New: func(t *testing.T) *env {
			db := b.Open(t)
			events, err := infrastructure.NewGormEventStore(db)
			require.NoError(t, err)
			cps, err := subscriptions.NewGormCheckpointStore(db)
			require.NoError(t, err)
			lot, err := subscriptions.NewGormParkingLot(db)
			require.NoError(t, err)
			return &env{Name: b.Name, Events: events, Cps: cps, Parking: lot}
		}})
	}
	return out
}

// appendN appends n events of type eventType over three aggregates.
func appendN(t testing.TB, store domain.EventStore, eventType string, first, n int) {
	t.Helper()
	for i := first; i < first+n; i++ {
		ev := domain.NewEventEnvelope[any](map[string]any{"n": i}, fmt.Sprintf("agg-%d", i%3), eventType, 0)
		require.NoError(t, store.Append(context.Background(), ev.AggregateID, -1, ev))
	}
}

var errParkPoison = errors.New("park: poison event refused")

// parkSubscriber builds a subscriber with fast polling and retries; opts
// come last and override them.
func parkSubscriber(t *testing.T, e *env, name string, h subscriptions.Handler, opts ...subscriptions.SubscriberOption) *subscriptions.Subscriber {
	t.Helper()
	base := []subscriptions.SubscriberOption{
		subscriptions.WithLogger(quietLogger()),
		subscriptions.WithPollInterval(10 * time.Millisecond),
		subscriptions.WithRetryBackoff(time.Millisecond, 8*time.Millisecond),
	}
	sub, err := subscriptions.NewSubscriber(name, e.Events, e.Cps, h, append(base, opts...)...)
	require.NoError(t, err)
	return sub
}

// running is a Subscriber's Run on a goroutine, started by start.
type running struct {
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// start runs sub.Run until stop or the test's cleanup, which stops it and
// waits (bounded) for it to return nil.
func start(t testing.TB, sub *subscriptions.Subscriber) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- sub.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels Run and requires it to return nil within 30 s.
func (r *running) stop(t testing.TB) {
	t.Helper()
	r.cancel()
	r.once.Do(func() {
		select {
		case r.err = <-r.done:
		case <-time.After(30 * time.Second):
			r.err = errors.New("Run did not return within 30s of its cancellation")
		}
	})
	require.NoError(t, r.err)
}

// waitCaughtUp waits until the subscriber's lag is 0.
func waitCaughtUp(t testing.TB, sub *subscriptions.Subscriber) {
	t.Helper()
	require.Eventually(t, func() bool {
		lag, err := sub.Lag(context.Background())
		return err == nil && lag == 0
	}, 30*time.Second, 5*time.Millisecond, "subscriber %q did not catch up", sub.Name())
}

// parkWaitParked waits until the subscriber lists n parked events.
func parkWaitParked(t *testing.T, sub *subscriptions.Subscriber, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		p, err := sub.ListParked(context.Background())
		return err == nil && len(p) == n
	}, 30*time.Second, 5*time.Millisecond, "subscriber %q did not park %d event(s)", sub.Name(), n)
}

// statusWait waits until the subscriber's Status satisfies ok.
func statusWait(t *testing.T, sub *subscriptions.Subscriber, what string, ok func(subscriptions.Status) bool) subscriptions.Status {
	t.Helper()
	var st subscriptions.Status
	var err error
	require.Eventually(t, func() bool {
		st, err = sub.Status(context.Background())
		return err == nil && ok(st)
	}, 30*time.Second, 2*time.Millisecond, "%s; last status %+v, error %v", what, st, err)
	return st
}

// aggregateIn returns an aggregate ID whose events fall in partition p of n.
func aggregateIn(p, n int, prefix string) string {
	for i := 0; ; i++ {
		id := fmt.Sprintf("%s-%d", prefix, i)
		if subscriptions.PartitionOf(id, n) == p {
			return id
		}
	}
}

func parkedIDs(ps []subscriptions.ParkedEvent) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.EventID)
	}
	return out
}

// logBuffer captures log output for assertions; safe for concurrent
// writes.
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

// quietLogger discards everything.
func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newHandler is admin.NewHandler, closed (its sampler stopped) at the
// test's cleanup.
func newHandler(t testing.TB, subs []*subscriptions.Subscriber, auth admin.Authorizer, opts ...admin.Option) *admin.Handler {
	t.Helper()
	h, err := admin.NewHandler(subs, auth, opts...)
	require.NoError(t, err)
	t.Cleanup(h.Close)
	return h
}
