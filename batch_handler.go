package subscriptions

import (
	"context"

	"github.com/eventfeed/subscriptions/domain"
)

// BatchHandler processes a whole batch of events in one call, in feed
// order, so that a projection can write them with one multi-row statement.
// With a GormCheckpointStore it runs inside the batch transaction
// (TxFromContext), which commits with the checkpoint advance: exactly-once,
// as for Handler. The slice is the subscriber's: the handler must not keep
// it past the call. It runs on the subscriber's goroutine (a partition
// worker's, with WithPartitions), like a Handler.
//
// With WithPartitions, batches of several partitions run at once: a batch
// handler that writes rows shared between partitions (a total per day fed
// by many aggregates) must lock them in a stable order, writing them in
// sorted key order (slices.Sorted(maps.Keys(m))), not in map order, or two
// partitions' batches deadlock; the database then aborts one, which is
// retried (docs/partitions.md, "Batch handlers").
type BatchHandler func(ctx context.Context, events []domain.EventEnvelope[any]) error

// WithBatchHandler makes the subscriber hand each batch to h in one call,
// instead of one event at a time to a Handler; pass a nil Handler to
// NewSubscriber with it.
//
// Failures keep the per-event guarantees: when h fails, the batch is
// rolled back whole (its writes through the batch transaction are
// discarded) and the same events are then handled one at a time, each
// as a one-event slice, until the position the failed batch reached. So
// the events before the poison event commit, the poison event alone is
// retried and parked (WithParkingLot) exactly as a failing Handler's
// event is, and the events after it go back to whole batches. Retries and
// ReplayParked also call h with a one-event slice. On a store without
// transactions (MemoryCheckpointStore) a failed batch's partial side
// effects are not undone, as for a Handler.
func WithBatchHandler(h BatchHandler) SubscriberOption {
	return func(s *Subscriber) { s.batchHandler = h }
}

// TypedBatch adapts a batch handler of events whose payloads are T to a
// BatchHandler, decoding each event's payload as domain.Subscribe does
// for a per-event handler (domain.DecodeEnvelope: a map[string]any or raw
// JSON read back from a database becomes a T through its JSON form). An
// event whose payload cannot become a T fails the batch with an error
// naming the event and both types, before h is called: the batch's events
// are then handled one at a time, and that event alone is retried and
// parked. Give it to WithBatchHandler:
//
//	subscriptions.WithBatchHandler(subscriptions.TypedBatch(func(ctx context.Context, deposits []domain.EventEnvelope[Deposited]) error {
//		// one multi-row upsert of the deposits
//	}))
//
// A batch of several event types wants a handler of its own per type, or
// T = json.RawMessage and a switch on EventType.
func TypedBatch[T any](h func(ctx context.Context, events []domain.EventEnvelope[T]) error) BatchHandler {
	if h == nil {
		return nil // NewSubscriber refuses it, as it refuses a nil handler
	}
	return func(ctx context.Context, events []domain.EventEnvelope[any]) error {
		typed := make([]domain.EventEnvelope[T], len(events))
		for i, ev := range events {
			t, err := domain.DecodeEnvelope[T](ev)
			if err != nil {
				return err
			}
			typed[i] = t
		}
		return h(ctx, typed)
	}
}

// perEvent adapts a BatchHandler to the per-event path (one at a time
// after a failure, retries, parking, replay).
func (h BatchHandler) perEvent() Handler {
	return func(ctx context.Context, ev domain.EventEnvelope[any]) error {
		return h(ctx, []domain.EventEnvelope[any]{ev})
	}
}

// handleBatch runs the batch handler on events when the subscriber has one
// and the runner is not going one event at a time after a failure. It
// returns the events left for the per-event loop (err is the batch
// handler's failure, for the batch's span): none when the batch
// handler took them all, all of them otherwise. done means the cycle ends
// with out: the batch handler failed, the batch was rolled back, and the
// runner takes the same events one at a time next cycle (outcomeMore), or
// the shutdown grace ran out (outcomeStopped). WithHandlerTimeout bounds
// the whole call.
func (r *runner) handleBatch(hctx context.Context, batch Batch, events []domain.EventEnvelope[any]) (perEvent []domain.EventEnvelope[any], out outcome, done bool, err error) {
	s := r.s
	if s.batchHandler == nil || len(events) == 0 {
		return events, 0, false, nil
	}
	if r.oneByOneThrough >= events[0].Position {
		return events, 0, false, nil
	}
	r.oneByOneThrough = 0
	if len(events) == 1 || r.graceExpired() {
		// The per-event path finds, retries and parks a lone event, and
		// stops at once when the shutdown grace has run out.
		return events, 0, false, nil
	}
	if s.queues != nil {
		// Hold first what waits behind a parked event: the batch handler
		// sees the rest. A head delivered again (after a reset) releases
		// its queue for the events after it, which the call then handles
		// after it, in order; if the call fails, the one-at-a-time path
		// starts from the lot again.
		kept := make([]domain.EventEnvelope[any], 0, len(events))
		for _, ev := range events {
			held, herr := r.hold(hctx, ev)
			if herr != nil {
				return nil, r.queueFailed(batch, ev, "holding the event behind its aggregate's parked event failed", herr), true, herr
			}
			if !held {
				kept = append(kept, ev)
				r.handled(ev)
			}
		}
		if len(kept) == 0 {
			return nil, 0, false, nil
		}
		defer func() {
			if done {
				r.queues.forget()
			}
		}()
		events = kept
	}
	ctx := hctx
	if s.handlerTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(hctx, s.handlerTimeout, ErrHandlerTimeout)
		defer cancel()
	}
	// As for a Handler: a statement that ended the batch transaction
	// fails the call, even if the handler swallowed its error.
	err = handlerResult(ctx, batch, s.batchHandler(ctx, events))
	if err == nil && !r.graceExpired() {
		return nil, 0, false, nil
	}
	r.rollback(batch)
	last := events[len(events)-1]
	if r.graceExpired() { // whatever the handler returned, as in handle
		if err == nil {
			err = ErrShutdownGrace
		}
		s.logger.Warn("subscriber: shutdown grace period expired; the batch is rolled back and delivered again after a restart",
			"subscriber", s.name, "from_position", events[0].Position, "to_position", last.Position, "grace", s.shutdownGrace, "error", err)
		return nil, outcomeStopped, true, err
	}
	r.oneByOneThrough = last.Position
	s.logger.Warn("subscriber: batch handler failed; handling the batch's events one at a time",
		"subscriber", s.name, "from_position", events[0].Position, "to_position", last.Position, "events", len(events), "error", err)
	return nil, outcomeMore, true, err
}
