package subscriptions_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
	"github.com/eventfeed/subscriptions/internal/dbtest"
)

// wakePoll is the poll interval of every wake test's subscriber: far longer
// than any test waits, so an event handled within seconds was handled
// because of a wake signal (or a re-check after one), never by polling.
const wakePoll = time.Hour

// wakeBound is how long a woken subscriber may take to handle an event
// before a test fails: generous for a loaded machine running -race, and
// still far below wakePoll.
const wakeBound = 30 * time.Second

// wakeCountingStore counts the feed reads a subscriber makes and lets a
// test act right after a read has computed its result (before the
// subscriber sees it).
type wakeCountingStore struct {
	domain.EventStore
	reads atomic.Int64
	heads atomic.Int64

	mu        sync.Mutex
	afterRead func(n int64, found int)
}

func (s *wakeCountingStore) ReadAfter(ctx context.Context, after int64, limit int) ([]domain.EventEnvelope[any], error) {
	events, err := s.EventStore.ReadAfter(ctx, after, limit)
	n := s.reads.Add(1)
	s.mu.Lock()
	hook := s.afterRead
	s.mu.Unlock()
	if hook != nil {
		hook(n, len(events))
	}
	return events, err
}

func (s *wakeCountingStore) HeadPosition(ctx context.Context) (int64, error) {
	s.heads.Add(1)
	return s.EventStore.HeadPosition(ctx)
}

func (s *wakeCountingStore) setAfterRead(hook func(n int64, found int)) {
	s.mu.Lock()
	s.afterRead = hook
	s.mu.Unlock()
}

// wakeCountingCheckpoints counts checkpoint reads.
type wakeCountingCheckpoints struct {
	subscriptions.CheckpointStore
	positions atomic.Int64
}

func (c *wakeCountingCheckpoints) Position(ctx context.Context, subscriber string) (int64, error) {
	c.positions.Add(1)
	return c.CheckpointStore.Position(ctx, subscriber)
}

// wakeHandled records when each event reached the handler.
type wakeHandled struct {
	ch chan wakeEvent
}

type wakeEvent struct {
	id  string
	at  time.Time
	sub string
}

func newWakeHandled(capacity int) *wakeHandled {
	return &wakeHandled{ch: make(chan wakeEvent, capacity)}
}

// handler returns a Handler that records each event for subscriber sub.
func (h *wakeHandled) handler(sub string) subscriptions.Handler {
	return func(_ context.Context, ev domain.EventEnvelope[any]) error {
		h.ch <- wakeEvent{id: ev.ID, at: time.Now(), sub: sub}
		return nil
	}
}

// next waits (bounded by wakeBound) for the next handled event.
func (h *wakeHandled) next(t *testing.T) wakeEvent {
	t.Helper()
	select {
	case ev := <-h.ch:
		return ev
	case <-time.After(wakeBound):
		t.Fatalf("no event handled within %v (poll interval %v): the wake signal did not wake the subscriber", wakeBound, wakePoll)
		return wakeEvent{}
	}
}

// wakeAppendOne appends one event and returns its ID and when Append began.
func wakeAppendOne(t *testing.T, store domain.EventStore, n int) (string, time.Time) {
	t.Helper()
	ev := domain.NewEventEnvelope[any](map[string]any{"n": n}, "wake-agg", "wake.test", 0)
	began := time.Now()
	require.NoError(t, store.Append(context.Background(), ev.AggregateID, -1, ev))
	return ev.ID, began
}

// wakeQuiet waits until the subscriber has made no feed read for quiet,
// i.e. it is idle in its poll wait with every quick re-check done, so that
// only a new wake signal can make it read again. Bounded by wakeBound when
// strict; otherwise (a listener on the default channel of the shared test
// database, which other tests' appends NOTIFY too) it gives up after two
// seconds and lets the caller measure anyway: stray wake-ups can only make
// the subscriber faster, never slower.
func wakeQuiet(t *testing.T, store *wakeCountingStore, quiet time.Duration, strict bool) {
	t.Helper()
	bound := wakeBound
	if !strict {
		bound = 2 * time.Second
	}
	deadline := time.Now().Add(bound)
	last := store.reads.Load()
	for time.Now().Before(deadline) {
		timer := time.NewTimer(quiet)
		<-timer.C
		now := store.reads.Load()
		if now == last && now > 0 {
			return
		}
		last = now
	}
	if strict {
		t.Fatalf("the subscriber never went quiet (%d reads)", last)
	}
	t.Logf("the subscriber keeps being woken (%d reads; other tests' NOTIFYs on the shared database?): measuring anyway", last)
}

// wakeLatencies appends n events one at a time, each after the subscriber
// went idle, and returns the Append-start-to-handler latencies. after, when
// not nil, runs after each Append (a manual NOTIFY on a custom channel).
func wakeLatencies(t *testing.T, appendTo domain.EventStore, counting *wakeCountingStore, handled *wakeHandled, n int, strict bool, after func()) []time.Duration {
	t.Helper()
	var out []time.Duration
	for i := range n {
		wakeQuiet(t, counting, 150*time.Millisecond, strict)
		id, began := wakeAppendOne(t, appendTo, i)
		if after != nil {
			after()
		}
		got := handled.next(t)
		require.Equal(t, id, got.id)
		out = append(out, got.at.Sub(began))
	}
	return out
}

// TestWakeSignalInProcess: with a 1-hour poll interval, a subscriber
// woken through NotifyingEventStore + InProcessNotifier handles each new
// event within milliseconds of the commit, on the memory store and on
// SQLite.
func TestWakeSignalInProcess(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		if b.Postgres {
			continue // cross-process: TestWakeSignalAcrossProcessesPostgres
		}
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := b.New(t)
			notifier := subscriptions.NewInProcessNotifier()
			appendTo := subscriptions.NewNotifyingEventStore(e.Events, notifier.Notify)
			counting := &wakeCountingStore{EventStore: e.Events}
			handled := newWakeHandled(16)
			sub, err := subscriptions.NewSubscriber("wake-inproc", counting, e.Checkpoints, handled.handler("wake-inproc"),
				subscriptions.WithPollInterval(wakePoll), subscriptions.WithWakeSignal(notifier.Subscribe()),
				subscriptions.WithLogger(quietLogger()))
			require.NoError(t, err)
			start(t, sub)

			latencies := wakeLatencies(t, appendTo, counting, handled, 5, true, nil)
			t.Logf("%s: Append start to handler start: %v", b.Name, latencies)
		})
	}
}

// TestWakeSignalAcrossProcessesPostgres: a second pool (another process, as
// far as the database can tell) appends; the GormEventStore's NOTIFY
// reaches the PostgresListener, which wakes the subscriber long before its
// 1-hour poll.
func TestWakeSignalAcrossProcessesPostgres(t *testing.T) {
	t.Parallel()
	pg := dbtest.NewPostgres(t)
	e := gormEnv(t, "postgres", pg.DB, pg)
	other, err := infrastructure.NewGormEventStore(pg.Open(t))
	require.NoError(t, err)

	logger, logs := newLogger()
	listener, err := subscriptions.NewPostgresListener(pg.DSN, subscriptions.WithListenerLogger(logger))
	require.NoError(t, err)
	counting := &wakeCountingStore{EventStore: e.Events}
	handled := newWakeHandled(16)
	sub, err := subscriptions.NewSubscriber("wake-pg", counting, e.Checkpoints, handled.handler("wake-pg"),
		subscriptions.WithPollInterval(wakePoll), subscriptions.WithWakeSignal(listener.Subscribe()),
		subscriptions.WithLogger(quietLogger()))
	require.NoError(t, err)

	wakeRunListener(t, listener)
	wakeWaitLog(t, logs, "postgres listener: listening", 1)
	start(t, sub)

	latencies := wakeLatencies(t, other, counting, handled, 5, false, nil)
	t.Logf("postgres across processes: Append start to handler start: %v", latencies)
}

// startWakeRecheck starts a subscriber named name on a memory store with
// a wake channel and the 1-hour poll, and returns once its first read
// is done: the set-up of the fruitless-wake tests.
func startWakeRecheck(t *testing.T, name string) (*infrastructure.MemoryStore, *wakeCountingStore, chan struct{}, *wakeHandled) {
	t.Helper()
	store := infrastructure.NewMemoryStore()
	counting := &wakeCountingStore{EventStore: store}
	wake := make(chan struct{}, 1)
	handled := newWakeHandled(4)
	sub, err := subscriptions.NewSubscriber(name, counting, subscriptions.NewMemoryCheckpointStore(), handled.handler(name),
		subscriptions.WithPollInterval(wakePoll), subscriptions.WithWakeSignal(wake), subscriptions.WithLogger(quietLogger()))
	require.NoError(t, err)

	firstRead := make(chan struct{})
	var once sync.Once
	counting.setAfterRead(func(int64, int) { once.Do(func() { close(firstRead) }) })
	start(t, sub)
	wakeRecv(t, firstRead, "the subscriber's first read")
	return store, counting, wake, handled
}

// TestWakeRecheckAfterFruitlessWake: a notification can arrive before the
// commit it announces is visible to the subscriber's read. Here the wake's
// read finds nothing and the event becomes visible right after it, with no
// further signal: the subscriber's quick re-check must find it, well before
// the 1-hour poll.
func TestWakeRecheckAfterFruitlessWake(t *testing.T) {
	t.Parallel()
	store, counting, wake, handled := startWakeRecheck(t, "wake-recheck")

	// The wake's read (the second) finds nothing; the event commits right
	// after it, before the subscriber even sees the empty result.
	ev := domain.NewEventEnvelope[any](map[string]any{"n": 1}, "wake-agg", "wake.test", 0)
	var found int
	var appendErr error
	appended := make(chan struct{})
	counting.setAfterRead(func(n int64, got int) {
		if n == 2 {
			found = got
			appendErr = store.Append(context.Background(), ev.AggregateID, -1, ev)
			close(appended)
		}
	})
	began := time.Now()
	wake <- struct{}{}
	wakeRecv(t, appended, "the wake's read")
	require.NoError(t, appendErr)
	require.Zero(t, found, "the wake's read must have found nothing")
	got := handled.next(t)
	require.Equal(t, ev.ID, got.id)
	t.Logf("handled %v after the fruitless wake, after %d reads", got.at.Sub(began), counting.reads.Load())
}

// TestWakeRechecksRepeatAfterFruitlessWake: run.go documents re-checks at
// 5, 25 and 100 ms after a wake that found nothing. Here the commit becomes
// visible only after the first re-check (5 ms) also found nothing; the
// 25 ms re-check must find it.
func TestWakeRechecksRepeatAfterFruitlessWake(t *testing.T) {
	t.Parallel()
	store, counting, wake, handled := startWakeRecheck(t, "wake-recheck2")

	ev := domain.NewEventEnvelope[any](map[string]any{"n": 1}, "wake-agg", "wake.test", 0)
	var appendErr error
	appended := make(chan struct{})
	counting.setAfterRead(func(n int64, _ int) {
		if n == 3 { // 1: start, 2: the wake's read, 3: the 5 ms re-check
			appendErr = store.Append(context.Background(), ev.AggregateID, -1, ev)
			close(appended)
		}
	})
	wake <- struct{}{}
	wakeRecv(t, appended, "the first re-check")
	require.NoError(t, appendErr)
	got := handled.next(t)
	require.Equal(t, ev.ID, got.id)
}

// TestWakeClosedChannelFallsBackToPolling: a closed wake channel is logged
// once and dropped; the subscriber then polls at its poll interval — it
// does not spin on the closed channel — and still handles new events.
func TestWakeClosedChannelFallsBackToPolling(t *testing.T) {
	t.Parallel()
	const poll = 100 * time.Millisecond
	store := infrastructure.NewMemoryStore()
	counting := &wakeCountingStore{EventStore: store}
	checkpoints := &wakeCountingCheckpoints{CheckpointStore: subscriptions.NewMemoryCheckpointStore()}
	wake := make(chan struct{})
	close(wake)
	logger, logs := newLogger()
	handled := newWakeHandled(4)
	sub, err := subscriptions.NewSubscriber("wake-closed", counting, checkpoints, handled.handler("wake-closed"),
		subscriptions.WithPollInterval(poll), subscriptions.WithWakeSignal(wake), subscriptions.WithLogger(logger))
	require.NoError(t, err)
	start(t, sub)

	wakeWaitLog(t, logs, "wake signal channel closed; falling back to polling", 1)
	calls := func() int64 { return counting.reads.Load() + counting.heads.Load() + checkpoints.positions.Load() }
	before := calls()
	window := time.NewTimer(500 * time.Millisecond) // a bounded negative check
	<-window.C
	made := calls() - before
	t.Logf("store calls in 500 ms at a %v poll interval: %d", poll, made)
	require.Less(t, made, int64(30), "a closed wake channel must not make the subscriber spin")
	require.Positive(t, made, "the subscriber must keep polling")

	id, _ := wakeAppendOne(t, store, 1)
	got := handled.next(t)
	require.Equal(t, id, got.id)
	require.Equal(t, 1, strings.Count(logs.String(), "wake signal channel closed"), "the closed channel is reported once:\n%s", logs)
	require.Contains(t, logs.String(), "level=WARN")
}

// wakeRecv waits (bounded) for ch to be closed or to deliver.
func wakeRecv(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(wakeBound):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// wakeWaitLog waits until logs contain substr at least n times.
func wakeWaitLog(t *testing.T, logs *logBuffer, substr string, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Count(logs.String(), substr) >= n },
		wakeBound, 5*time.Millisecond, "expected %d× %q in the log:\n%s", n, substr, logs)
}

// wakeRunListener runs l until the test's cleanup, which cancels it and
// requires Run to return nil promptly.
func wakeRunListener(t *testing.T, l *subscriptions.PostgresListener) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err, "Run must return nil on cancellation")
			case <-time.After(wakeBound):
				t.Fatal("PostgresListener.Run did not return after cancellation")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
