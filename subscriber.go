package subscriptions

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/eventfeed/subscriptions/domain"
)

// Handler processes a single event from the feed. EventDispatcher.Dispatch
// satisfies this signature, so a dispatcher with registered pattern
// handlers can be wired directly as a Subscriber's handler.
//
// When the subscriber's CheckpointStore is database-backed, the context
// passed to the handler carries the batch's transaction (see
// TxFromContext): writes made through it commit atomically with the
// checkpoint advance, giving exactly-once processing for same-database
// handlers. Handlers with side effects outside that transaction must
// tolerate at-least-once delivery; DeliveryFrom tells them a replay from
// live traffic.
//
// A handler runs on the subscriber's goroutine, one event at a time (with
// WithConcurrency(k), on up to k partition workers at once). By
// default its context has no deadline and is not cancelled when Run's
// context is: an in-flight batch is drained on shutdown, so a handler that
// blocks forever blocks shutdown. WithHandlerTimeout and WithShutdownGrace
// bound both (see the package documentation, Shutdown); only a handler
// that honours its context can be stopped.
type Handler func(ctx context.Context, event domain.EventEnvelope[any]) error

var (
	// ErrNoParkingLot is returned by ListParked and ReplayParked on a
	// subscriber created without WithParkingLot.
	ErrNoParkingLot = errors.New("subscriber has no parking lot (WithParkingLot)")

	// ErrCheckpointAhead is returned by Lag when the checkpoint is past the
	// feed head: the events table was truncated or the checkpoint was reset
	// past the head, and the subscriber would silently skip every event
	// until positions catch up.
	ErrCheckpointAhead = errors.New("checkpoint is ahead of the feed head")

	// ErrRunning is returned by Run when the same Subscriber's Run is
	// already running, and by DeleteState while it runs.
	ErrRunning = errors.New("subscriber is already running")
)

// Subscriber runs a Handler as a crash-safe background worker over the
// event store's global ordered feed. Each cycle acquires the subscriber's
// checkpoint, reads a batch of events past it via EventStore.ReadAfter,
// invokes the handler for each event, and advances the checkpoint. Because
// the checkpoint is the only state, crash recovery and normal startup are
// the same code path (the package documentation's model says what holds
// whichever of the read and the acquisition comes first).
//
// A handler error abandons the whole batch — the checkpoint stays put, any
// handler writes made through the batch transaction roll back, and the
// batch is retried. The events before the failing one are then committed
// in a batch of their own at once, so one failing event never holds back
// the events ahead of it; the failing event itself is retried after the
// poll interval (or, with WithParkingLot, retried with backoff and then
// parked). Events are therefore delivered at-least-once; handlers writing
// through TxFromContext get exactly-once.
//
// A Subscriber's methods are safe for concurrent use. Run runs one loop at
// a time: a second Run while the first is running returns ErrRunning, and
// a Subscriber can be run again once its Run has returned. To run replicas, create one Subscriber per replica (in one
// process or several) with the same name, each with its own wake channel:
// the checkpoint store lets one batch at a time proceed.
type Subscriber struct {
	name        string
	events      domain.EventStore
	checkpoints CheckpointStore
	// parking is WithParkingLot's lot; a partition's Subscriber parks
	// under the partitioned subscriber's name (partitionLot).
	parking ParkingLot
	// queues is the lot as WithOrderedParking holds events in (nil
	// without the option); a partition's is its subscriber's.
	queues *queueLot
	// partitions and concurrency are WithPartitions and WithConcurrency;
	// 0 when not given, and for a partition's own Subscriber (see
	// partition.go).
	partitions, concurrency int

	// config is the rest of the configuration, shared (and never written
	// after NewSubscriber) by the Subscribers that run a partitioned
	// subscriber's partitions.
	*config

	// running is set while Run runs (one Run at a time per Subscriber).
	running atomic.Bool

	// What NewSubscriber derives from the stores and the configuration,
	// once (a partition's Subscriber has its own):

	// tel is the subscriber's instrumentation and live state (telemetry.go).
	tel *telemetry
	// clearer is the parking lot when it removes the entries of events a
	// live batch delivered (DeliveredClearer).
	clearer DeliveredClearer
	// acquirer reads the feed and acquires the checkpoint for the run loop
	// (see acquirer).
	acquirer acquirer
	// attempts keeps the attempt counts: the checkpoint store when it
	// can (AttemptCounter), else this subscriber's memory.
	attempts AttemptCounter
	// classifier tells the events' commit failures from the store's: the
	// checkpoint store when it can (FailureClassifier).
	classifier FailureClassifier
	// parent is, for a partition's Subscriber (partitionChild), the
	// partitioned one; nil otherwise.
	parent *Subscriber
}

// config is a Subscriber's configuration as NewSubscriber's options leave
// it (see the options for each field's meaning).
type config struct {
	// handler is the Handler, or with WithBatchHandler its per-event
	// adapter (see batch_handler.go).
	handler      Handler
	batchHandler BatchHandler

	batchSize      int
	pollInterval   time.Duration
	logger         *slog.Logger
	wake           <-chan struct{}
	retry          retryPolicy
	handlerTimeout time.Duration
	shutdownGrace  time.Duration
	stuckThreshold time.Duration
	maxLagTime     time.Duration
	meterProvider  metric.MeterProvider
	tracerProvider trace.TracerProvider

	// firstRunCatchUp and firstRunThreshold are WithFirstRunCatchUp's.
	firstRunCatchUp   bool
	firstRunThreshold int64

	// noTelemetry (tests only) turns the instruments off: the baseline the
	// telemetry benchmarks compare with.
	noTelemetry bool
	// retryGiven records WithMaxRetries or WithRetryBackoff, for
	// NewSubscriber's warning when there is no parking lot to retry for.
	retryGiven bool
	// ordered is WithOrderedParking.
	ordered bool

	// tenant is the Group tenant the subscriber runs for (its logs,
	// metrics, spans and Status carry it); "" for a standalone one.
	tenant string
	// afterReset, set by a Group, is told of a reset or a resume this
	// Subscriber made, so that the group runs the name again although no
	// event arrived (it does not poll idle tenants). nil otherwise.
	afterReset func()
}

// retryPolicy is how a failing event is retried before it is parked
// (WithMaxRetries, WithRetryBackoff): the one home of "1 + WithMaxRetries
// attempts in all" and of the doubling backoff.
type retryPolicy struct {
	maxRetries   int
	initial, max time.Duration
}

// attempts is how many attempts an event gets before it is parked.
func (p retryPolicy) attempts() int { return 1 + p.maxRetries }

// backoff returns the delay before retry n (n >= 1): the initial delay
// doubled per retry, capped at the maximum.
func (p retryPolicy) backoff(n int) time.Duration {
	d := p.initial
	for i := 1; i < n && d < p.max; i++ {
		d *= 2
	}
	return min(d, p.max)
}

// NewSubscriber creates a subscriber. name identifies the checkpoint —
// processes using the same name share one position. handler is invoked for
// every event in feed order; EventDispatcher.Dispatch satisfies the Handler
// signature for pattern-based routing.
//
// Every argument is checked: an error names the argument (or option) that
// is out of range.
func NewSubscriber(name string, events domain.EventStore, checkpoints CheckpointStore, handler Handler, opts ...SubscriberOption) (*Subscriber, error) {
	s := &Subscriber{
		name:        name,
		events:      events,
		checkpoints: checkpoints,
		config: &config{
			handler:        handler,
			batchSize:      DefaultBatchSize,
			pollInterval:   DefaultPollInterval,
			retry:          retryPolicy{maxRetries: DefaultMaxRetries, initial: DefaultRetryBackoff, max: DefaultMaxRetryBackoff},
			stuckThreshold: DefaultStuckThreshold,
		},
	}
	for _, opt := range opts {
		if opt != nil {
			opt(s)
		}
	}
	err := s.validate()
	if err != nil {
		return nil, fmt.Errorf("subscriptions: NewSubscriber(%q): %w", name, err)
	}
	if s.logger == nil {
		s.logger = slog.Default()
	}
	if s.tenant != "" {
		s.logger = s.logger.With("tenant", s.tenant)
	}
	if s.batchHandler != nil {
		s.handler = s.batchHandler.perEvent()
	}
	if isNil(s.parking) {
		s.parking = nil
	}
	if s.queues, err = s.newQueueLot(); err != nil {
		return nil, fmt.Errorf("subscriptions: NewSubscriber(%q): %w", name, err)
	}
	if s.parking == nil && s.retryGiven {
		s.logger.Warn("subscriber: WithMaxRetries and WithRetryBackoff apply only with WithParkingLot; without one a failing event halts the subscriber and is retried every poll interval",
			"subscriber", name, "poll_interval", s.pollInterval)
	}
	if isNil(s.meterProvider) {
		s.meterProvider = nil
	}
	if isNil(s.tracerProvider) {
		s.tracerProvider = nil
	}
	tel, err := newTelemetry(name, s.meterProvider, s.tracerProvider)
	if err != nil {
		return nil, fmt.Errorf("subscriptions: NewSubscriber(%q): %w", name, err)
	}
	if s.tenant != "" {
		tel.withTenant(s.tenant)
	}
	s.tel = tel
	s.tel.off = s.noTelemetry
	s.clearer, _ = s.parking.(DeliveredClearer)
	if c, ok := s.checkpoints.(AttemptCounter); ok {
		s.attempts = c
	} else {
		s.attempts = &localAttempts{}
	}
	s.classifier, _ = s.checkpoints.(FailureClassifier)
	s.acquirer = newAcquirer(s.events, s.checkpoints)
	return s, nil
}

func (s *Subscriber) validate() error {
	if err := validateName(s.name); err != nil {
		return fmt.Errorf("name: %w", err)
	}
	if err := reservedName(s.name); err != nil {
		return fmt.Errorf("name: %w", err)
	}
	switch {
	case isNil(s.events):
		return errors.New("events: nil event store")
	case isNil(s.checkpoints):
		return errors.New("checkpoints: nil checkpoint store")
	case s.handler == nil && s.batchHandler == nil:
		return errors.New("handler: nil handler (and no WithBatchHandler)")
	case s.handler != nil && s.batchHandler != nil:
		return errors.New("handler: give a nil Handler with WithBatchHandler, not both")
	case s.batchSize <= 0:
		return fmt.Errorf("batch size %d must be positive (WithBatchSize)", s.batchSize)
	case s.pollInterval <= 0:
		return fmt.Errorf("poll interval %v must be positive (WithPollInterval)", s.pollInterval)
	case s.retry.maxRetries < 0:
		return fmt.Errorf("max retries %d must not be negative (WithMaxRetries)", s.retry.maxRetries)
	case s.handlerTimeout < 0:
		return fmt.Errorf("handler timeout %v must not be negative (WithHandlerTimeout)", s.handlerTimeout)
	case s.shutdownGrace < 0:
		return fmt.Errorf("shutdown grace %v must not be negative (WithShutdownGrace)", s.shutdownGrace)
	case s.retry.initial <= 0 || s.retry.max < s.retry.initial:
		return fmt.Errorf("retry backoff initial %v, maximum %v: initial must be positive and maximum at least initial (WithRetryBackoff)", s.retry.initial, s.retry.max)
	case s.stuckThreshold <= 0:
		return fmt.Errorf("stuck threshold %v must be positive (WithStuckThreshold)", s.stuckThreshold)
	case s.maxLagTime < 0:
		return fmt.Errorf("max lag time %v must not be negative (WithMaxLagTime)", s.maxLagTime)
	}
	if err := s.validateCatchUp(); err != nil {
		return err
	}
	return s.validatePartitions()
}

// undecorated returns the store under this package's decorators
// (NotifyingEventStore, TracingEventStore), whose reads are the wrapped
// store's own: the checkpoint store may then read the feed directly.
func undecorated(store domain.EventStore) domain.EventStore {
	for {
		switch d := store.(type) {
		case *NotifyingEventStore:
			store = d.EventStore
		case *TracingEventStore:
			store = d.EventStore
		default:
			return store
		}
	}
}

// isNil reports a nil interface or an interface holding a nil pointer, so
// that a typed nil store is refused instead of panicking later.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return rv.IsNil()
	}
	return false
}

// Name returns the subscriber's checkpoint name.
func (s *Subscriber) Name() string { return s.name }

// Lag returns how far the subscriber's committed checkpoint trails the feed
// head (0 when caught up). Status reports it with its age in time, and the
// subscriptions.lag.events gauge exports it (see WithMeterProvider). For a
// partitioned subscriber it is the number of events not yet handled,
// summed over the partitions (see PartitionLags).
//
// A checkpoint ahead of the head is reported as an error wrapping
// ErrCheckpointAhead rather than clamped to 0: it means the events table
// was truncated or the checkpoint was reset past the head, and the
// subscriber would otherwise look caught up while silently skipping
// everything until positions catch back up.
func (s *Subscriber) Lag(ctx context.Context) (int64, error) {
	if s.partitions > 0 {
		return s.partitionedLag(ctx)
	}
	position, head, err := s.positions(ctx, "lag")
	if err != nil {
		return 0, err
	}
	return head - position, nil
}

// positions reads the committed checkpoint and the feed head for Lag and
// Status (op names the caller in errors). A checkpoint ahead of the head
// returns both positions with an error wrapping ErrCheckpointAhead.
func (s *Subscriber) positions(ctx context.Context, op string) (position, head int64, err error) {
	positions, err := s.checkpointPositions(ctx, []string{s.name})
	if err != nil {
		return 0, 0, err // the store names the subscriber
	}
	position = positions[0]
	head, err = s.events.HeadPosition(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("subscriptions: %s of %q: %w", op, s.name, err)
	}
	if position > head {
		return position, head, s.checkpointAhead(op, position, head)
	}
	return position, head, nil
}

// checkpointAhead is the error of a checkpoint ahead of the feed head.
func (s *Subscriber) checkpointAhead(op string, position, head int64) error {
	return fmt.Errorf("subscriptions: %s of %q: checkpoint %d, feed head %d: %w", op, s.name, position, head, ErrCheckpointAhead)
}

// ResetCheckpoint sets the subscriber's checkpoint. Resetting to 0 replays
// all history — incrementally and resumably, since replay uses the same
// batch/checkpoint cycle as live processing. It is safe while the
// subscriber runs: the checkpoint store serializes with in-flight batches
// (see CheckpointStore.Reset), so the reset is never silently overwritten.
// A partitioned subscriber's partitions all move, in one transaction with
// this module's stores. A negative position is an error. Handlers get the
// events up to the old checkpoint as re-deliveries (DeliveryFrom).
//
// Parked events after position stay listed until the subscriber delivers
// them again: a success removes the entry in the same transaction, a
// failure parks the event again with its new error. Until then
// ReplayParked refuses them (ErrParkedAfterCheckpoint), since the event
// would otherwise be handled twice.
func (s *Subscriber) ResetCheckpoint(ctx context.Context, position int64) error {
	if err := validatePosition(s.name, position); err != nil {
		return err
	}
	// The partition count is checked by the store once a batch in flight
	// is held off (countGuard); a store of another kind is asked first.
	reset := func(ctx context.Context, name string, position int64) error {
		if err := s.checkPartitionCount(ctx); err != nil {
			return err
		}
		return s.checkpoints.Reset(ctx, name, position)
	}
	if ps, ok := s.checkpoints.(PartitionCheckpointStore); ok {
		reset = func(ctx context.Context, name string, position int64) error {
			return ps.ResetAll(ctx, []string{name}, position, s.countGuard, nil)
		}
	}
	if s.partitions > 0 {
		reset = func(ctx context.Context, _ string, position int64) error { return s.resetPartitions(ctx, position) }
	}
	if err := reset(ctx, s.name, position); err != nil {
		return err // the store names the subscriber and the position
	}
	s.logger.Info("subscriber checkpoint reset", "subscriber", s.name, "position", position)
	s.notifyReset()
	return nil
}

// notifyReset tells a Group running s that its checkpoint was reset or
// resumed (afterReset).
func (s *Subscriber) notifyReset() {
	if s.afterReset != nil {
		s.afterReset()
	}
}

// ListParked returns this subscriber's parked events ordered by position.
// Requires a ParkingLot (WithParkingLot); otherwise the error wraps
// ErrNoParkingLot.
func (s *Subscriber) ListParked(ctx context.Context) ([]ParkedEvent, error) {
	if s.parking == nil {
		return nil, fmt.Errorf("subscriptions: list parked events of %q: %w", s.name, ErrNoParkingLot)
	}
	return s.parking.List(ctx, s.name) // the lot names the subscriber in its errors
}

// ReplayParked re-runs the handler for one parked event and clears it on
// success (a failed replay leaves the event parked; with a
// ManagedParkingLot it records the replay as one more attempt, with its
// error and time). The event is loaded fresh from the event store;
// database-backed parking lots run the handler and the row deletion in one
// transaction, exposed via TxFromContext exactly like a live batch. Requires a ParkingLot (WithParkingLot).
// With WithOrderedParking, the entries of the event's aggregate parked
// behind it are then replayed in order, each the same way, until one
// fails (it stays parked, as its queue's head, and its error is returned).
//
// An event the store does not have returns an error wrapping
// domain.ErrEventNotFound; a stored event that is not parked for this
// subscriber, one wrapping ErrEventNotParked; one whose replay is already
// running, an error wrapping ErrReplayInProgress (the handler did not
// run); a parked event after the checkpoint, which the subscriber will
// deliver again (see ResetCheckpoint), one wrapping
// ErrParkedAfterCheckpoint; one behind an earlier parked event of its
// aggregate (held, or any with WithOrderedParking), one wrapping
// ErrParkedBehindHead. On a database served by a single connection
// (in-memory SQLite) the event load queues behind the running replay's
// transaction instead, and then finds the event no longer parked.
func (s *Subscriber) ReplayParked(ctx context.Context, eventID string) error {
	_, _, err := s.replayParked(ctx, eventID)
	return err
}

// replayOne is ReplayParked of one entry, queue aside, its handler call
// delivered as d says (DeliveryFrom).
func (s *Subscriber) replayOne(ctx context.Context, eventID string, d Delivery) error {
	// The event is loaded first, as the original did: an ID the store does
	// not know is domain.ErrEventNotFound whether or not a parked entry
	// names it (a parked event whose row is gone cannot be replayed either).
	event, err := s.events.GetEventByID(ctx, eventID)
	if err != nil {
		return fmt.Errorf("subscriptions: replay event %q for %q: load event: %w", eventID, s.name, err)
	}
	if err := s.refuseAfterCheckpoint(ctx, event); err != nil {
		return err
	}
	// herr tells the handler's own failure apart from the lot's.
	var herr error
	traced := s.tel.replayHandler(s.handler)
	handler := func(hctx context.Context, ev domain.EventEnvelope[any]) error {
		herr = traced(withDelivery(hctx, d), ev)
		return herr
	}
	if err := s.parking.Replay(withTenant(ctx, s.tenant), s.name, eventID, event, handler); err != nil {
		if herr != nil {
			if rerr := s.recordReplayFailure(ctx, event, herr); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
		return err // the lot names the event and the subscriber
	}
	s.tel.count(ctx, OutcomeReplayed, 1)
	s.logger.Info("parked event replayed", "subscriber", s.name, "event_id", eventID, "event_type", event.EventType, "position", event.Position)
	return nil
}

// refuseAfterCheckpoint refuses the replay of an event the subscriber will
// deliver again (ErrParkedAfterCheckpoint), unless it is not parked at all
// (ErrEventNotParked). The checkpoint is read before the replay begins: a
// Reset that races the replay is not caught.
func (s *Subscriber) refuseAfterCheckpoint(ctx context.Context, event domain.EventEnvelope[any]) error {
	checkpoint := s.name
	if s.partitions > 0 { // the checkpoint of the event's partition
		checkpoint = partitionName(s.name, PartitionOf(event.AggregateID, s.partitions), s.partitions)
	}
	position, err := s.checkpoints.Position(ctx, checkpoint)
	if err != nil {
		return fmt.Errorf("subscriptions: replay event %q: %w", event.ID, err) // the store names the subscriber
	}
	if event.Position <= position {
		return nil
	}
	parked, err := s.parking.List(ctx, s.name)
	if err != nil {
		return fmt.Errorf("subscriptions: replay event %q: %w", event.ID, err) // the lot names the subscriber
	}
	for _, p := range parked {
		if p.EventID == event.ID {
			return fmt.Errorf("subscriptions: replay event %q (position %d) for %q: checkpoint %d: %w", event.ID, event.Position, s.name, position, ErrParkedAfterCheckpoint)
		}
	}
	return fmt.Errorf("subscriptions: replay event %q for %q: %w", event.ID, s.name, ErrEventNotParked)
}

// eventAttrs are the log attributes that make a handler failure
// actionable.
func (s *Subscriber) eventAttrs(ev domain.EventEnvelope[any]) []any {
	return []any{"subscriber", s.name, "position", ev.Position, "event_id", ev.ID, "event_type", ev.EventType}
}
