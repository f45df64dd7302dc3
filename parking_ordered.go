package subscriptions

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/eventfeed/subscriptions/domain"
)

// ErrParkedBehindHead is returned by ReplayParked (and counted as held by
// ReplayParkedMatching) for a parked event that waits behind an earlier
// parked event of its aggregate: replaying it first would apply the
// aggregate's events out of order. Replay the head (ParkedEvent.HeldBy,
// named in the error), which replays the queue behind it, or discard it.
var ErrParkedBehindHead = errors.New("the parked event waits behind an earlier parked event of its aggregate")

// WithOrderedParking keeps each aggregate's events in order when one of
// them is parked: its later events are held behind it until it succeeds
// (the package documentation, Failures, states the guarantee). It needs
// WithParkingLot with an OrderedParkingLot (this package's lots and
// pgxstore's are); NewSubscriber refuses it otherwise. Events without an
// aggregate ID are never held. The default, without it, is the original
// module's: a parked event is skipped and the aggregate's later events are
// handled. Give it to every replica of the name: a replica without it (an
// older version during a rolling upgrade included) handles the batches it
// wins as the default does, so an aggregate's later events can pass its
// parked head; start the replicas with it before the first event is held.
func WithOrderedParking() SubscriberOption {
	return func(s *Subscriber) { s.ordered = true }
}

// OrderedParkingLot is the optional capability of a ManagedParkingLot that
// keeps a queue per aggregate, which WithOrderedParking needs: without it
// NewSubscriber refuses the option, and ReplayParked replays one entry. A
// subscriber's queue of aggregate A is its entries of A (AggregateID not
// empty) in position order; the first is the queue's head. An entry is
// parked for its own failure (Park), or held behind the head (Hold): never
// attempted, it waits for the head. Whichever call changes the lot, it
// keeps three rules:
//
//   - a queue's first entry is never held: when it leaves (Replay,
//     Discard, ClearDelivered, ClearPartitionDelivered), the next entry
//     becomes the head in the same transaction, so that no queue is ever
//     without a head, even after a crash;
//   - List, ListFiltered and Get return a held entry with HeldBy, its
//     queue's head; other entries without;
//   - Hold holds only behind an entry that is still parked: a Hold racing
//     the removal of the head either is held before the removal (and the
//     removal then makes it the head) or finds it gone, never neither.
//
// Implementations are safe for concurrent use.
type OrderedParkingLot interface {
	ManagedParkingLot
	// ParkedHeads returns the head of each of subscriber's queues, in no
	// particular order, through the batch transaction ctx carries when it
	// is one of the lot's database (as Park), in one indexed lookup. The
	// run loop makes at most one per batch, and none while it knows the
	// queues (see WithOrderedParking).
	ParkedHeads(ctx context.Context, subscriber string) ([]ParkedEvent, error)
	// Hold parks held behind its aggregate's queue, through the batch
	// transaction as Park, when an entry of the aggregate lies before
	// held.Position, and returns the head's event ID (held again, an entry
	// is updated). When none does it writes nothing and returns "": the
	// queue was released, and the caller handles the event.
	Hold(ctx context.Context, held ParkedEvent) (head string, err error)
	// CountHeld returns how many of subscriber's entries are held (Status).
	CountHeld(ctx context.Context, subscriber string) (int, error)
}

// queueLot is the lot a WithOrderedParking subscriber holds events in, and
// the name its entries are kept under (a partition's are its
// subscriber's, as partitionLot parks them).
type queueLot struct {
	lot  OrderedParkingLot
	name string
}

// newQueueLot returns the subscriber's queueLot, nil without
// WithOrderedParking, or the error of a lot that cannot keep queues.
func (s *Subscriber) newQueueLot() (*queueLot, error) {
	if !s.ordered {
		return nil, nil
	}
	if s.parking == nil {
		return nil, errors.New("ordered parking needs a parking lot (WithOrderedParking without WithParkingLot)")
	}
	lot, ok := s.parking.(OrderedParkingLot)
	if !ok {
		return nil, fmt.Errorf("parking lot %T cannot keep queues: it does not implement OrderedParkingLot (WithOrderedParking)", s.parking)
	}
	return &queueLot{lot: lot, name: s.name}, nil
}

// queueView is a runner's knowledge of its subscriber's queues: the
// position of each held aggregate's head. It is exact at the checkpoint at
// (this runner looked the heads up in the batch it committed there, or
// kept them exact through it), and is looked up again (ParkedHeads, in
// the batch's transaction) by a batch that starts anywhere else: after a
// wait, a skip, a moved checkpoint, a failure, a retry or a parking, any
// of which another replica, a reset or a restart may have changed the
// queues behind. Batches run back to back by one runner look nothing up,
// with or without queues: another replica's batch in between moves the
// checkpoint or holds it (and the next batch looks up), unless a reset
// and another replica's catch-up to the very same position fit between
// this runner's commit and its next acquisition, which no test can
// provoke and this view does not see. A queue released meanwhile (a
// replay or discard, in any process) only shrinks the truth; Hold finds
// it so and the event is handled.
type queueView struct {
	heads map[string]int64
	at    int64
	// held are the positions the batch in flight held, ascending.
	held []int64
}

// lookUp makes the view exact for a batch from start: one ParkedHeads in
// the batch's transaction (hctx), unless it is already.
func (v *queueView) lookUp(hctx context.Context, q *queueLot, start int64) error {
	v.held = v.held[:0]
	if v.at == start && v.heads != nil {
		v.at = -1 // exact again once this batch commits
		return nil
	}
	v.at = -1
	heads, err := q.lot.ParkedHeads(hctx, q.name)
	if err != nil {
		v.heads = nil
		return err
	}
	v.heads = make(map[string]int64, len(heads))
	for _, h := range heads {
		if old, ok := v.heads[h.AggregateID]; !ok || h.Position < old {
			v.heads[h.AggregateID] = h.Position
		}
	}
	return nil
}

// forget makes the next batch look the heads up.
func (v *queueView) forget() { v.at, v.heads = -1, nil }

// hold parks ev behind its aggregate's queue when the view says it has
// one with a head before ev (a head at ev's own position is the head
// delivered again after a reset: it is handled). held is false when ev is
// to be handled: no queue, or one released meanwhile.
func (r *runner) hold(hctx context.Context, ev domain.EventEnvelope[any]) (held bool, err error) {
	q, v := r.s.queues, &r.queues
	if q == nil || ev.AggregateID == "" {
		return false, nil
	}
	at, ok := v.heads[ev.AggregateID]
	if !ok || ev.Position <= at {
		return false, nil
	}
	head, err := q.lot.Hold(hctx, ParkedEvent{
		Subscriber: q.name, EventID: ev.ID, EventType: ev.EventType, Position: ev.Position,
		ParkedAt: time.Now().UTC(), AggregateID: ev.AggregateID,
	})
	if err != nil {
		return false, err
	}
	if head == "" {
		delete(v.heads, ev.AggregateID) // released meanwhile
		return false, nil
	}
	v.held = append(v.held, ev.Position)
	r.s.logger.Info("subscriber: event held behind its aggregate's parked event", append(r.s.eventAttrs(ev), "aggregate_id", ev.AggregateID, "held_by", head)...)
	return true, nil
}

// handled notes that ev was handled in the batch in flight: when it is a
// queue's head delivered again (after a reset), the queue is released for
// the rest of the batch (the batch's commit removes the entry).
func (r *runner) handled(ev domain.EventEnvelope[any]) {
	if at, ok := r.queues.heads[ev.AggregateID]; ok && r.s.queues != nil && ev.AggregateID != "" && at == ev.Position {
		delete(r.queues.heads, ev.AggregateID)
	}
}

// queueFailed ends a batch whose ParkedHeads or Hold failed: the lot's own
// statement, which says nothing about the event (as a failed
// ClearDelivered): the batch is rolled back and retried after the poll
// interval.
func (r *runner) queueFailed(batch Batch, ev domain.EventEnvelope[any], what string, err error) outcome {
	r.rollback(batch)
	r.known = -1
	r.queues.forget()
	r.s.logger.Error("subscriber: "+what+"; will retry", append(r.s.eventAttrs(ev), "error", err)...)
	r.s.tel.fail("", &ev, 0, err)
	return outcomeFailed
}

// clearDelivered removes the entries of the events the batch (start,
// last] handled: all but the ones it held (queueView.held), one
// ClearDelivered per range between them.
func (r *runner) clearDelivered(ctx context.Context, c DeliveredClearer, start, last int64) error {
	after := start
	for _, h := range r.queues.held {
		if h <= after || h > last {
			continue // not this batch's
		}
		if h-1 > after {
			if err := c.ClearDelivered(ctx, r.s.name, after, h-1); err != nil {
				return err
			}
		}
		after = h
	}
	if last > after {
		return c.ClearDelivered(ctx, r.s.name, after, last)
	}
	return nil
}

// refuseBehindHead refuses the replay of an entry that waits behind its
// queue's head (ErrParkedBehindHead): a held one always, and with
// WithOrderedParking any entry that is not its queue's first. An entry
// that is not parked is left to the replay to report.
func (s *Subscriber) refuseBehindHead(ctx context.Context, lot OrderedParkingLot, eventID string) (ParkedEvent, error) {
	p, err := lot.Get(ctx, s.name, eventID)
	if errors.Is(err, ErrEventNotParked) {
		return ParkedEvent{}, nil
	}
	if err != nil {
		return ParkedEvent{}, fmt.Errorf("subscriptions: replay event %q: %w", eventID, err) // the lot names the subscriber
	}
	head := p.HeldBy
	if head == "" && s.queues != nil && p.AggregateID != "" {
		first, err := lot.ListFiltered(ctx, s.name, ParkedFilter{AggregateID: p.AggregateID, Limit: 1})
		if err != nil {
			return ParkedEvent{}, fmt.Errorf("subscriptions: replay event %q: %w", eventID, err)
		}
		if len(first) == 1 && first[0].EventID != eventID {
			head = first[0].EventID
		}
	}
	if head != "" {
		return ParkedEvent{}, fmt.Errorf("subscriptions: replay event %q (position %d) for %q: aggregate %q has event %q parked before it: %w; replay or discard that one",
			eventID, p.Position, s.name, p.AggregateID, head, ErrParkedBehindHead)
	}
	return p, nil
}

// replayQueue replays, after head (an entry of aggregate, just replayed),
// the entries of its queue in order, each as ReplayParked replays one,
// until the queue is empty or one fails; that one stays parked as the
// queue's head, and it is returned with its error. It returns the IDs it
// replayed. An entry still there after its replay succeeded (parked again
// meanwhile) ends it too: it heads the queue again.
func (s *Subscriber) replayQueue(ctx context.Context, lot OrderedParkingLot, aggregate, head string) (replayed []string, failed ParkedEvent, err error) {
	replayed = []string{}
	done := map[string]bool{head: true}
	for {
		next, err := lot.ListFiltered(ctx, s.name, ParkedFilter{AggregateID: aggregate, Limit: 1})
		if err != nil {
			return replayed, ParkedEvent{}, fmt.Errorf("subscriptions: replay the queue of aggregate %q behind %q: %w", aggregate, head, err)
		}
		if len(next) == 0 || done[next[0].EventID] {
			return replayed, ParkedEvent{}, nil
		}
		n := next[0]
		done[n.EventID] = true
		if err := s.replayOne(ctx, n.EventID, replayDelivery(n)); err != nil {
			if errors.Is(err, ErrEventNotParked) {
				continue // discarded or replayed meanwhile
			}
			return replayed, n, fmt.Errorf("subscriptions: replay the queue of aggregate %q behind %q (%d replayed after it): %w", aggregate, head, len(replayed), err)
		}
		replayed = append(replayed, n.EventID)
	}
}

// replayDelivery is the Delivery of the replay of entry p (the zero
// ParkedEvent when it was not read): a parked replay, unless p was only
// ever held behind its aggregate's queue, never reaching a handler, whose
// first delivery this is (live: its side effects have not happened).
func replayDelivery(p ParkedEvent) Delivery {
	if p.EventID != "" && p.Attempts == 0 && p.Error == "" {
		return Delivery{}
	}
	return Delivery{Kind: DeliveryParkedReplay}
}

// replayParked is ReplayParked, returning the IDs of the events it
// replayed (the one asked for first, then its queue's) and, when the
// queue stopped at an entry, that entry.
func (s *Subscriber) replayParked(ctx context.Context, eventID string) (replayed []string, failed ParkedEvent, err error) {
	if s.parking == nil {
		return nil, ParkedEvent{}, fmt.Errorf("subscriptions: replay event %q for %q: %w", eventID, s.name, ErrNoParkingLot)
	}
	lot, ordered := s.parking.(OrderedParkingLot)
	var p ParkedEvent
	if ordered {
		if p, err = s.refuseBehindHead(ctx, lot, eventID); err != nil {
			return nil, ParkedEvent{}, err
		}
	}
	if err := s.replayOne(ctx, eventID, replayDelivery(p)); err != nil {
		return nil, ParkedEvent{}, err
	}
	if s.queues == nil || p.AggregateID == "" {
		return []string{eventID}, ParkedEvent{}, nil
	}
	more, failed, err := s.replayQueue(ctx, lot, p.AggregateID, eventID)
	return append([]string{eventID}, more...), failed, err
}
