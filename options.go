package subscriptions

import (
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

const (
	// DefaultBatchSize is the number of events read per cycle when
	// WithBatchSize is not supplied.
	DefaultBatchSize = 100

	// DefaultPollInterval is how long an idle subscriber waits before
	// checking the feed again when WithPollInterval is not supplied.
	DefaultPollInterval = time.Second

	// DefaultMaxRetries is how many times a failing handler is retried per
	// event (after the initial attempt) before the event is parked, when a
	// ParkingLot is configured and WithMaxRetries is not supplied.
	DefaultMaxRetries = 5

	// DefaultRetryBackoff is the first retry delay; it doubles per attempt.
	DefaultRetryBackoff = 100 * time.Millisecond

	// DefaultMaxRetryBackoff caps the doubling retry delay.
	DefaultMaxRetryBackoff = 5 * time.Second

	// DefaultStuckThreshold is how long Healthy lets the checkpoint stand
	// still while events wait, when WithStuckThreshold is not supplied.
	DefaultStuckThreshold = time.Minute
)

// SubscriberOption configures a Subscriber. Options are applied in order by
// NewSubscriber, which validates the result and names the offending
// argument when a value is out of range.
type SubscriberOption func(*Subscriber)

// WithBatchSize sets how many events are read per cycle (default
// DefaultBatchSize). One cycle is one database transaction, so larger
// batches amortise the per-cycle round trips; n <= 0 is rejected.
func WithBatchSize(n int) SubscriberOption {
	return func(s *Subscriber) { s.batchSize = n }
}

// WithPollInterval sets how long an idle subscriber waits before checking
// the feed again (default DefaultPollInterval). It is also the retry delay
// after a failed batch. d <= 0 is rejected.
func WithPollInterval(d time.Duration) SubscriberOption {
	return func(s *Subscriber) { s.pollInterval = d }
}

// WithLogger sets the logger for batch failures and lifecycle events. The
// default is slog.Default() — a permanently failing subscriber must be
// visible somewhere out of the box. nil means the default.
func WithLogger(logger *slog.Logger) SubscriberOption {
	return func(s *Subscriber) { s.logger = logger }
}

// WithWakeSignal lets the subscriber wake on new commits instead of
// waiting out the poll interval: pass InProcessNotifier.Subscribe()
// (single-process / SQLite) or PostgresListener.Subscribe() (cross-process
// via LISTEN/NOTIFY). Each subscriber needs its own channel — channel
// receives are point-to-point, so a shared channel would wake only one
// subscriber per signal. Polling continues as the fallback, so
// notifications are never load-bearing. A closed channel is detected and
// the subscriber falls back to pure polling.
func WithWakeSignal(wake <-chan struct{}) SubscriberOption {
	return func(s *Subscriber) { s.wake = wake }
}

// WithParkingLot enables poison-event handling: a handler that keeps
// failing on one event has the event parked (with its error) after bounded
// retries, and the checkpoint advances past it so the events behind it keep
// flowing. Without a parking lot, a failing event abandons the batch and is
// retried every poll interval forever.
//
// Failed attempts' writes are discarded only when the batch has a real
// transaction (GormCheckpointStore) and the handler writes through it; with
// MemoryCheckpointStore or out-of-transaction side effects, each retry
// re-applies whatever the handler did before failing.
func WithParkingLot(lot ParkingLot) SubscriberOption {
	return func(s *Subscriber) { s.parking = lot }
}

// WithMaxRetries sets how many times a failing handler is retried per event
// (after the initial attempt) before the event is parked (default
// DefaultMaxRetries). Only meaningful with WithParkingLot: without one a
// failing event halts the checkpoint and is retried every poll interval,
// and NewSubscriber logs a warning that the option changes nothing (it is
// accepted, as the original module accepts it). n < 0 is rejected; 0
// parks on the first failure.
func WithMaxRetries(n int) SubscriberOption {
	return func(s *Subscriber) { s.retry.maxRetries, s.retryGiven = n, true }
}

// WithRetryBackoff sets the first retry delay and its cap; the delay
// doubles per attempt up to the cap (defaults DefaultRetryBackoff and
// DefaultMaxRetryBackoff). initial must be positive and maximum at least
// initial.
//
// No database transaction is held while a retry waits: each retry runs in a
// short transaction of its own, so backoff never holds a row lock. Like
// WithMaxRetries it applies only with WithParkingLot (NewSubscriber warns
// otherwise).
func WithRetryBackoff(initial, maximum time.Duration) SubscriberOption {
	return func(s *Subscriber) {
		s.retry.initial, s.retry.max = initial, maximum
		s.retryGiven = true
	}
}

// WithHandlerTimeout gives each handler call a context with a deadline d
// after the call starts (default 0: no deadline). A handler that returns
// once its context is done has failed like any other error (wrapping
// ErrHandlerTimeout): the event is retried, and with WithParkingLot
// eventually parked. It bounds how long one hung call (SMTP, HTTP) can
// hold the batch, and with it the checkpoint and, on SQLite, the write
// lock. d < 0 is rejected. ReplayParked, which an operator calls, runs
// the handler on the caller's context instead.
//
// The batch transaction (TxFromContext) is not bound to this context:
// pass ctx to its statements (tx.WithContext(ctx)) to bound them too, at
// the price of a connection that the driver may close when the deadline
// interrupts a statement, which fails the batch.
func WithHandlerTimeout(d time.Duration) SubscriberOption {
	return func(s *Subscriber) { s.handlerTimeout = d }
}

// WithShutdownGrace bounds the drain on shutdown: d after Run's context is
// cancelled, the context of the handler still running in the batch in
// flight is cancelled (with cause ErrShutdownGrace), the batch rolls back
// and Run returns; the batch's events are delivered again after a restart.
// The default, 0, keeps the unbounded drain: the batch in flight finishes
// and commits, however long its handlers take. d < 0 is rejected.
func WithShutdownGrace(d time.Duration) SubscriberOption {
	return func(s *Subscriber) { s.shutdownGrace = d }
}

// WithMeterProvider sets where the subscriber's metrics go (default: the
// global provider, otel.GetMeterProvider(), which does nothing until the
// application installs an SDK). docs/observability.md lists the metrics.
// nil means the default.
func WithMeterProvider(mp metric.MeterProvider) SubscriberOption {
	return func(s *Subscriber) { s.meterProvider = mp }
}

// WithTracerProvider sets where the subscriber's spans go (default: the
// global provider, otel.GetTracerProvider(), which does nothing until the
// application installs an SDK). nil means the default.
func WithTracerProvider(tp trace.TracerProvider) SubscriberOption {
	return func(s *Subscriber) { s.tracerProvider = tp }
}

// WithStuckThreshold sets how long the checkpoint may stand still while
// events wait before Healthy reports ErrSubscriberStuck (default
// DefaultStuckThreshold). Make it longer than the slowest batch and than a
// poison event's whole retry schedule. While the subscriber is idle,
// Healthy allows the poll interval on top (see Healthy), so a poll
// interval longer than the threshold is no false alarm. d <= 0 is
// rejected.
func WithStuckThreshold(d time.Duration) SubscriberOption {
	return func(s *Subscriber) { s.stuckThreshold = d }
}

// WithMaxLagTime makes Healthy report ErrLagTooOld when the oldest event
// not yet handled is older than d (see Status.LagSeconds). The default, 0,
// checks no age: a subscriber catching up on a long history is healthy as
// long as it moves. d < 0 is rejected.
func WithMaxLagTime(d time.Duration) SubscriberOption {
	return func(s *Subscriber) { s.maxLagTime = d }
}
