package subscriptions

import (
	"context"
	"errors"
	"sync"

	"github.com/eventfeed/subscriptions/domain"
)

// fanout is the wake-signal broadcaster shared by InProcessNotifier and
// PostgresListener. Each subscribe call gets its own channel with a buffer
// of one: a Go channel receive is point-to-point, so a broadcast needs one
// channel per receiver, and a buffer of one is exactly "a signal is
// pending" — more would only make a busy subscriber re-check the feed
// several times for commits it reads in one go.
//
// The fanout owns the channels: it is their only sender and never closes
// them (a closed wake channel would drop a subscriber to pure polling), so
// they stay valid for as long as anyone holds them. The zero value is ready
// to use and safe for concurrent use.
type fanout struct {
	mu   sync.Mutex
	subs []chan struct{}
}

// subscribe registers and returns a new channel. It is retained for the
// fanout's lifetime: call it once per subscriber, not once per cycle.
func (f *fanout) subscribe() <-chan struct{} {
	ch := make(chan struct{}, 1)
	f.mu.Lock()
	f.subs = append(f.subs, ch)
	f.mu.Unlock()
	return ch
}

// notify puts a signal in every channel that has none pending. It never
// blocks: a subscriber that is busy (or never reads) already has a signal
// waiting, which covers this commit too, since a woken subscriber reads
// everything past its checkpoint.
func (f *fanout) notify() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ch := range f.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// InProcessNotifier fans a commit signal out to subscribers in the same
// process — the SQLite / single-process counterpart of Postgres
// LISTEN/NOTIFY. Wire it by wrapping the event store in a
// NotifyingEventStore and passing each subscriber a Subscribe() channel via
// WithWakeSignal.
//
// Signals are best-effort wake-ups, never load-bearing: sends never block
// (a subscriber that is busy keeps at most one pending signal), and a
// missed signal costs at most one poll interval.
//
// An InProcessNotifier is safe for concurrent use: Notify and Subscribe may
// be called from any goroutine, at any time. The zero value is ready to
// use. The notifier owns the channels Subscribe returns — it is their only
// sender and never closes them — and starts no goroutine, so there is
// nothing to stop.
type InProcessNotifier struct {
	subs fanout
}

// NewInProcessNotifier creates a notifier with no subscribers.
func NewInProcessNotifier() *InProcessNotifier {
	return &InProcessNotifier{}
}

// Notify wakes all subscribers without blocking: each subscribed channel
// that has no signal pending gets one, and a channel that already holds
// one is left as it is (that pending signal covers this call too). It is
// cheap enough to call on every commit, from any goroutine.
func (n *InProcessNotifier) Notify() {
	n.subs.notify()
}

// Subscribe returns a channel that receives after each Notify. Pass it to a
// Subscriber via WithWakeSignal.
//
// Every subscriber needs its own channel (a channel receive is
// point-to-point; a shared channel would wake only one subscriber per
// Notify). The channel has a buffer of one and is never closed; the
// notifier keeps it for its own lifetime, so call Subscribe once per
// subscriber, not per run.
func (n *InProcessNotifier) Subscribe() <-chan struct{} {
	return n.subs.subscribe()
}

// NotifyingEventStore decorates an EventStore so every successful Append
// fires a callback — typically InProcessNotifier.Notify — after the events
// are durably stored. Wrap the store handed to the UnitOfWork (or used
// directly) so background subscribers wake on new commits instead of
// waiting out their poll interval.
//
// Postgres deployments don't need this: the GORM event store NOTIFYs on
// commit by itself (see infrastructure.PostgresNotifyChannel) and
// PostgresListener picks it up across processes.
//
// Every method other than Append is the wrapped store's own (through the
// embedded domain.EventStore). A NotifyingEventStore is as safe for
// concurrent use as the store it wraps; the callback may run concurrently
// with itself when appends are concurrent. The wrapped store stays the
// caller's: Close closes it, exactly as calling its own Close would.
type NotifyingEventStore struct {
	domain.EventStore
	notify func()
}

// NewNotifyingEventStore wraps store; notify runs after every successful
// Append. notify runs on the appending goroutine, so it must be quick and
// must not block (InProcessNotifier.Notify is both); a nil notify signals
// nothing. A nil store is a programming error and panics here, rather than
// on the first call through the wrapper.
func NewNotifyingEventStore(store domain.EventStore, notify func()) *NotifyingEventStore {
	if isNil(store) {
		panic("subscriptions: NewNotifyingEventStore: nil event store")
	}
	return &NotifyingEventStore{EventStore: store, notify: notify}
}

// Append delegates to the wrapped store and signals on success. A failed
// Append (a concurrency conflict, invalid events) stored nothing, so it
// signals nothing; neither does an Append of no events. The signal comes
// after the wrapped Append has returned, i.e. after the events are
// committed and visible to readers, so a woken subscriber finds them.
// A retry answered with domain.ErrAlreadyAppended signals too: the
// attempt that committed those events may have failed before its signal.
func (s *NotifyingEventStore) Append(ctx context.Context, aggregateID string, expectedVersion int, events ...domain.EventEnvelope[any]) error {
	err := s.EventStore.Append(ctx, aggregateID, expectedVersion, events...)
	if err != nil && !errors.Is(err, domain.ErrAlreadyAppended) {
		return err
	}
	if len(events) > 0 && s.notify != nil {
		s.notify()
	}
	return err
}
