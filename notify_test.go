package subscriptions_test

import (
	"context"
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/infrastructure"
)

// wakePending reports whether ch holds a signal, taking it.
func wakePending(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestInProcessNotifierNeverBlocks: Notify returns at once even when a
// subscriber never reads, and such a channel holds at most one signal.
func TestInProcessNotifierNeverBlocks(t *testing.T) {
	t.Parallel()
	n := subscriptions.NewInProcessNotifier()
	neverRead := n.Subscribe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 10_000 {
			n.Notify()
		}
	}()
	select {
	case <-done:
	case <-time.After(wakeBound):
		t.Fatal("Notify blocked on a subscriber that never reads")
	}
	require.Equal(t, 1, cap(neverRead), "a Subscribe channel has a buffer of one")
	require.Equal(t, 1, len(neverRead), "10,000 Notify calls leave exactly one pending signal")
	require.True(t, wakePending(neverRead))
	require.False(t, wakePending(neverRead), "a channel keeps at most one pending signal")
}

// TestInProcessNotifierEverySubscriberReceivesEachNotify: every channel gets
// each Notify (a broadcast, not a point-to-point send), channels are
// independent, and a channel subscribed later gets the Notify calls after
// its Subscribe.
func TestInProcessNotifierEverySubscriberReceivesEachNotify(t *testing.T) {
	t.Parallel()
	n := subscriptions.NewInProcessNotifier()
	n.Notify() // no subscribers: a no-op
	chans := []<-chan struct{}{n.Subscribe(), n.Subscribe(), n.Subscribe(), n.Subscribe(), n.Subscribe()}
	for _, ch := range chans {
		require.False(t, wakePending(ch), "a new channel has no signal pending")
	}
	for round := range 3 {
		n.Notify()
		for i, ch := range chans {
			require.True(t, wakePending(ch), "round %d: channel %d missed the Notify", round, i)
			require.False(t, wakePending(ch))
		}
	}

	// A busy subscriber (channel 0 not drained) does not hold back the
	// others, and keeps exactly one signal.
	n.Notify()
	n.Notify()
	late := n.Subscribe()
	require.False(t, wakePending(late), "a Notify before Subscribe is not delivered to the new channel")
	n.Notify()
	for i, ch := range append(chans, late) {
		require.True(t, wakePending(ch), "channel %d", i)
		require.False(t, wakePending(ch), "channel %d holds more than one signal", i)
	}

	var zero subscriptions.InProcessNotifier // the zero value works too
	ch := zero.Subscribe()
	zero.Notify()
	require.True(t, wakePending(ch))
}

// TestInProcessNotifierConcurrentUse: Notify and Subscribe from many
// goroutines at once (run under -race); after the storm, one more Notify
// reaches every channel.
func TestInProcessNotifierConcurrentUse(t *testing.T) {
	t.Parallel()
	n := subscriptions.NewInProcessNotifier()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var chans []<-chan struct{}
	for range 8 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for range 200 {
				n.Notify()
			}
		}()
		go func() {
			defer wg.Done()
			for range 20 {
				ch := n.Subscribe()
				mu.Lock()
				chans = append(chans, ch)
				mu.Unlock()
				wakePending(ch)
			}
		}()
	}
	wg.Wait()
	for _, ch := range chans {
		wakePending(ch)
	}
	n.Notify()
	for i, ch := range chans {
		require.True(t, wakePending(ch), "channel %d", i)
	}
}

// wakeRecordingStore records which EventStore methods were called on it.
type wakeRecordingStore struct {
	domain.EventStore
	mu    sync.Mutex
	calls map[string]int
}

func (s *wakeRecordingStore) record(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.calls == nil {
		s.calls = map[string]int{}
	}
	s.calls[name]++
}

func (s *wakeRecordingStore) called() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for name := range s.calls {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

func (s *wakeRecordingStore) Append(ctx context.Context, id string, v int, evs ...domain.EventEnvelope[any]) error {
	s.record("Append")
	return s.EventStore.Append(ctx, id, v, evs...)
}

func (s *wakeRecordingStore) GetEvents(ctx context.Context, id string) ([]domain.EventEnvelope[any], error) {
	s.record("GetEvents")
	return s.EventStore.GetEvents(ctx, id)
}

func (s *wakeRecordingStore) GetEventsFromVersion(ctx context.Context, id string, from int) ([]domain.EventEnvelope[any], error) {
	s.record("GetEventsFromVersion")
	return s.EventStore.GetEventsFromVersion(ctx, id, from)
}

func (s *wakeRecordingStore) GetEventsRange(ctx context.Context, id string, from, to int) ([]domain.EventEnvelope[any], error) {
	s.record("GetEventsRange")
	return s.EventStore.GetEventsRange(ctx, id, from, to)
}

func (s *wakeRecordingStore) GetEventByID(ctx context.Context, id string) (domain.EventEnvelope[any], error) {
	s.record("GetEventByID")
	return s.EventStore.GetEventByID(ctx, id)
}

func (s *wakeRecordingStore) GetEventsByTransactionID(ctx context.Context, id string) ([]domain.EventEnvelope[any], error) {
	s.record("GetEventsByTransactionID")
	return s.EventStore.GetEventsByTransactionID(ctx, id)
}

func (s *wakeRecordingStore) GetCurrentVersion(ctx context.Context, id string) (int, error) {
	s.record("GetCurrentVersion")
	return s.EventStore.GetCurrentVersion(ctx, id)
}

func (s *wakeRecordingStore) ReadAfter(ctx context.Context, after int64, limit int) ([]domain.EventEnvelope[any], error) {
	s.record("ReadAfter")
	return s.EventStore.ReadAfter(ctx, after, limit)
}

func (s *wakeRecordingStore) HeadPosition(ctx context.Context) (int64, error) {
	s.record("HeadPosition")
	return s.EventStore.HeadPosition(ctx)
}

func (s *wakeRecordingStore) Close() error {
	s.record("Close")
	return s.EventStore.Close()
}

// TestNotifyingEventStoreSignalsOnlyAfterSuccessfulAppend: the callback
// runs once per successful Append, after the events are readable, and never
// for a failed Append (a version conflict, an invalid event) or an Append of
// nothing — on every backend.
func TestNotifyingEventStoreSignalsOnlyAfterSuccessfulAppend(t *testing.T) {
	t.Parallel()
	for _, b := range envBackends() {
		t.Run(b.Name, func(t *testing.T) {
			e := b.New(t)
			ctx := context.Background()
			var signals atomic.Int64
			var visibleAtSignal []int64
			store := subscriptions.NewNotifyingEventStore(e.Events, func() {
				signals.Add(1)
				head, err := e.Events.HeadPosition(ctx)
				if err != nil {
					head = -1
				}
				visibleAtSignal = append(visibleAtSignal, head)
			})

			ev := domain.NewEventEnvelope[any](map[string]any{"n": 1}, "notify-agg", "notify.test", 0)
			require.NoError(t, store.Append(ctx, ev.AggregateID, 0, ev))
			require.Equal(t, int64(1), signals.Load())

			two := domain.NewEventEnvelope[any](map[string]any{"n": 2}, "notify-agg", "notify.test", 0)
			three := domain.NewEventEnvelope[any](map[string]any{"n": 3}, "notify-agg", "notify.test", 0)
			require.NoError(t, store.Append(ctx, ev.AggregateID, 1, two, three))
			require.Equal(t, int64(2), signals.Load(), "one signal per Append, however many events")

			stale := domain.NewEventEnvelope[any](map[string]any{"n": 4}, "notify-agg", "notify.test", 0)
			err := store.Append(ctx, ev.AggregateID, 1, stale)
			require.ErrorIs(t, err, domain.ErrConcurrencyConflict)
			require.Equal(t, int64(2), signals.Load(), "a failed Append must not signal")

			require.Error(t, store.Append(ctx, "", -1, stale), "an invalid aggregate ID fails")
			other := ev
			other.Payload = map[string]any{"n": 99}
			require.ErrorIs(t, store.Append(ctx, ev.AggregateID, -1, other), domain.ErrInvalidEvent, "another event under a stored ID fails")
			require.Equal(t, int64(2), signals.Load(), "a failed Append must not signal")

			require.NoError(t, store.Append(ctx, ev.AggregateID, 3))
			require.Equal(t, int64(2), signals.Load(), "an Append of no events stores nothing and signals nothing")

			// The attempt that committed may have failed before its signal.
			require.ErrorIs(t, store.Append(ctx, ev.AggregateID, 0, ev), domain.ErrAlreadyAppended)
			require.Equal(t, int64(3), signals.Load(), "the retry of a committed append signals")

			require.Equal(t, []int64{1, 3, 3}, visibleAtSignal, "the signal comes after the events are readable")
			events, err := store.ReadAfter(ctx, 0, 0)
			require.NoError(t, err)
			require.Len(t, events, 3)
		})
	}
}

// TestNotifyingEventStorePassesThroughOtherMethods: every method but Append
// is the wrapped store's own, and none of them signals.
func TestNotifyingEventStorePassesThroughOtherMethods(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	inner := &wakeRecordingStore{EventStore: infrastructure.NewMemoryStore()}
	var signals atomic.Int64
	store := subscriptions.NewNotifyingEventStore(inner, func() { signals.Add(1) })
	var _ domain.EventStore = store

	ev := domain.NewEventEnvelope[any](map[string]any{"n": 1}, "pass-agg", "pass.test", 0)
	ev.TransactionID = "tx-1"
	require.NoError(t, store.Append(ctx, ev.AggregateID, 0, ev))
	require.Equal(t, int64(1), signals.Load())

	got, err := store.GetEvents(ctx, ev.AggregateID)
	require.NoError(t, err)
	require.Len(t, got, 1)
	_, err = store.GetEventsFromVersion(ctx, ev.AggregateID, 1)
	require.NoError(t, err)
	_, err = store.GetEventsRange(ctx, ev.AggregateID, 1, 1)
	require.NoError(t, err)
	byID, err := store.GetEventByID(ctx, ev.ID)
	require.NoError(t, err)
	require.Equal(t, ev.ID, byID.ID)
	byTx, err := store.GetEventsByTransactionID(ctx, "tx-1")
	require.NoError(t, err)
	require.Len(t, byTx, 1)
	version, err := store.GetCurrentVersion(ctx, ev.AggregateID)
	require.NoError(t, err)
	require.Equal(t, 1, version)
	feed, err := store.ReadAfter(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, feed, 1)
	head, err := store.HeadPosition(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), head)
	_, err = store.GetEventByID(ctx, "no-such-event")
	require.True(t, errors.Is(err, domain.ErrEventNotFound), "errors pass through unchanged; got %v", err)
	require.NoError(t, store.Close())

	require.Equal(t, []string{"Append", "Close", "GetCurrentVersion", "GetEventByID", "GetEvents", "GetEventsByTransactionID",
		"GetEventsFromVersion", "GetEventsRange", "HeadPosition", "ReadAfter"}, inner.called())
	require.Equal(t, int64(1), signals.Load(), "only Append signals")
	require.Same(t, inner, store.EventStore.(*wakeRecordingStore), "the wrapped store is embedded as is")
}

// TestNotifyingEventStoreConstructor: a nil callback signals nothing; a nil
// store is refused at construction.
func TestNotifyingEventStoreConstructor(t *testing.T) {
	t.Parallel()
	store := subscriptions.NewNotifyingEventStore(infrastructure.NewMemoryStore(), nil)
	appendN(t, store, "nil.notify", 0, 2)
	head, err := store.HeadPosition(context.Background())
	require.NoError(t, err)
	require.Equal(t, int64(2), head)

	require.PanicsWithValue(t, "subscriptions: NewNotifyingEventStore: nil event store", func() {
		subscriptions.NewNotifyingEventStore(nil, func() {})
	})
	var typedNil *infrastructure.MemoryStore
	require.Panics(t, func() { subscriptions.NewNotifyingEventStore(typedNil, func() {}) })
}
