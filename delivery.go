package subscriptions

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/eventfeed/subscriptions/domain"
)

// DeliveryKind says why a handler is given an event: for the first time,
// or again (see Delivery and the package documentation, Replays and live
// traffic).
type DeliveryKind int

const (
	// DeliveryLive is the first delivery of an event to the name (a retry
	// of a failed attempt is live too: its earlier attempts failed).
	DeliveryLive DeliveryKind = iota
	// DeliveryRedelivery is an event the name had handled before a reset
	// (ResetCheckpoint, ResetCheckpointWith) moved its checkpoint back
	// before it: its side effects happened then.
	DeliveryRedelivery
	// DeliveryCatchUp is an event of the history a name run for the first
	// time is catching up on (WithFirstRunCatchUp): another version of the
	// projection, running under its own name, handled it.
	DeliveryCatchUp
	// DeliveryParkedReplay is ReplayParked's (and ReplayParkedMatching's)
	// call: the event failed and was parked; whether its side effect
	// happened depends on where the handler failed. The entries a replay
	// releases from behind it (WithOrderedParking) are live: no handler
	// saw them before.
	DeliveryParkedReplay
)

// String names the kind ("live", "redelivery", "catch-up", "parked-replay").
func (k DeliveryKind) String() string {
	switch k {
	case DeliveryLive:
		return "live"
	case DeliveryRedelivery:
		return "redelivery"
	case DeliveryCatchUp:
		return "catch-up"
	case DeliveryParkedReplay:
		return "parked-replay"
	}
	return fmt.Sprintf("DeliveryKind(%d)", int(k))
}

// Delivery is the nature of one handler call, which DeliveryFrom reads
// from the handler's context: a handler updates its projection on every
// delivery and keeps a side effect outside the batch transaction (an
// email, a webhook, a message) for live ones. Every event of a call has
// the same Delivery: a batch ends where the nature changes.
type Delivery struct {
	Kind DeliveryKind
	// Through is the last position of the stretch of the feed the call
	// belongs to: for a redelivery, the highest checkpoint the name (with
	// WithPartitions, the event's partition) had before the resets that
	// replay it; for a catch-up, the feed head at the name's first start.
	// 0 for the other kinds.
	Through int64
}

// Replay reports whether the call repeats an earlier delivery, by this
// name or another version of it: every kind but DeliveryLive.
func (d Delivery) Replay() bool { return d.Kind != DeliveryLive }

type deliveryKey struct{}

// DeliveryFrom returns the Delivery of the handler call whose context ctx
// is (a Handler's, a BatchHandler's, or the handler call of ReplayParked);
// a context of no handler call reads as live. The nature of a redelivery
// or a catch-up comes from marks the checkpoint store records durably
// (DeliveryMarker): without that capability every call but a parked
// replay reads as live.
func DeliveryFrom(ctx context.Context) Delivery {
	if ctx == nil {
		return Delivery{}
	}
	d, _ := ctx.Value(deliveryKey{}).(Delivery)
	return d
}

func withDelivery(ctx context.Context, d Delivery) context.Context {
	return context.WithValue(ctx, deliveryKey{}, d)
}

// DeliveryMarks are what a DeliveryMarker records about a checkpoint row,
// which its batches read with the row's lock (MarkedBatch).
type DeliveryMarks struct {
	// RedeliveredThrough: events up to this position, past the
	// checkpoint, were handled before a reset moved the checkpoint back.
	// It is the highest checkpoint the row had before its resets, and is
	// simply left behind once the checkpoint passes it.
	RedeliveredThrough int64
	// CatchUpThrough: events up to this position are the history of the
	// name's first start (StartCatchUp); 0 when none was recorded.
	CatchUpThrough int64
}

// at returns the Delivery of the event at position and the last position
// with the same one.
func (m DeliveryMarks) at(position int64) (Delivery, int64) {
	switch {
	case position <= m.RedeliveredThrough:
		return Delivery{Kind: DeliveryRedelivery, Through: m.RedeliveredThrough}, m.RedeliveredThrough
	case position <= m.CatchUpThrough:
		return Delivery{Kind: DeliveryCatchUp, Through: m.CatchUpThrough}, m.CatchUpThrough
	}
	return Delivery{}, math.MaxInt64
}

// DeliveryMarker is the optional capability of a CheckpointStore that
// records, durably and shared by every replica and partition of a name,
// which part of the feed past a checkpoint is delivered again, for
// DeliveryFrom. Without it every delivery reads as live (a parked replay
// excepted) and WithFirstRunCatchUp is refused. This package's stores
// have it; subscriptionstest.RunDeliveryMarkerSuite checks a store of
// your own. A store with it:
//
//   - records, in the transaction of each Reset, ResetWith and
//     PartitionCheckpointStore.ResetAll, each moved row's redelivery mark:
//     the highest of its previous mark and the checkpoint it had before
//     the reset, so that a second reset during a rebuild keeps the
//     highest;
//   - seeds the partitions of InitPartitions with the plain row's mark,
//     as with its checkpoint, and the rows of a Repartition's new layout
//     with the lowest mark of the old (RepartitionRows);
//   - forgets a row's marks, and its name's catch-up mark, with Delete
//     and DeleteAll;
//   - hands out batches that are MarkedBatch, reading the marks with the
//     checkpoint row's lock, in the same statement (no round trip more).
type DeliveryMarker interface {
	// StartCatchUp records through as the catch-up mark of key (a
	// subscriber's name, under which every row of it is marked, as
	// PauseKey says), unless key has one already or one of rows has a
	// checkpoint: only a name's first start records it, and replicas
	// starting at once record one. It is atomic against the others'.
	StartCatchUp(ctx context.Context, key string, rows []string, through int64) error
}

// MarkedBatch is the optional capability of a Batch of a DeliveryMarker:
// DeliveryMarks returns the marks of its checkpoint row as read with the
// row's lock, which no reset moves while the batch holds it.
type MarkedBatch interface {
	DeliveryMarks() DeliveryMarks
}

// marksOf returns the marks batch read with its checkpoint (none without
// the capability).
func marksOf(batch Batch) DeliveryMarks {
	if m, ok := batch.(MarkedBatch); ok {
		return m.DeliveryMarks()
	}
	return DeliveryMarks{}
}

// sameDelivery returns the Delivery of events' first event under batch's
// marks and events cut where the delivery changes, so that every call of
// the batch has one nature.
func sameDelivery(batch Batch, events []domain.EventEnvelope[any]) (Delivery, []domain.EventEnvelope[any]) {
	return marksOf(batch).same(events)
}

// same returns the Delivery of events' first event under m and events cut
// where the delivery changes.
func (m DeliveryMarks) same(events []domain.EventEnvelope[any]) (Delivery, []domain.EventEnvelope[any]) {
	d, through := m.at(events[0].Position)
	for i, ev := range events {
		if ev.Position > through {
			return d, events[:i]
		}
	}
	return d, events
}

// WithFirstRunCatchUp makes the first start of the subscriber's name,
// when the feed head is then more than threshold positions past 0, mark
// every event up to that head as DeliveryCatchUp: the new version of a
// blue/green rebuild (see SwitchOver), whose old version has already sent
// the emails of that history. The mark is recorded before anything is
// handled, with the name's checkpoints (DeliveryMarker), so a restart in
// the middle of the catch-up, any replica and every partition know it.
// Events appended after that start are live (until SwitchOver the old
// version gets them too). The threshold keeps a name started on a short
// feed (a new deployment) live; 0 makes any history a catch-up.
//
// Only a name without checkpoints yet gets it (a later start, however far
// behind the head, does not): events a running name has not handled yet
// are not a replay, since their side effects have not happened. A handler
// that skips stale side effects compares the event's time itself. A
// negative threshold is rejected, and so is a checkpoint store without
// DeliveryMarker (the error wraps errors.ErrUnsupported).
func WithFirstRunCatchUp(threshold int64) SubscriberOption {
	return func(s *Subscriber) { s.firstRunCatchUp, s.firstRunThreshold = true, threshold }
}

// validateCatchUp checks WithFirstRunCatchUp.
func (s *Subscriber) validateCatchUp() error {
	if !s.firstRunCatchUp {
		return nil
	}
	if s.firstRunThreshold < 0 {
		return fmt.Errorf("catch-up threshold %d must not be negative (WithFirstRunCatchUp)", s.firstRunThreshold)
	}
	if _, ok := s.checkpoints.(DeliveryMarker); !ok {
		return fmt.Errorf("catch-up (WithFirstRunCatchUp): checkpoint store %T does not implement DeliveryMarker: %w", s.checkpoints, errors.ErrUnsupported)
	}
	return nil
}

// startCatchUp records the catch-up of the name's first start
// (WithFirstRunCatchUp) before Run handles anything, retrying a failure
// every poll interval: running without it would deliver the history as
// live. stop is true when ctx ended first.
func (s *Subscriber) startCatchUp(ctx context.Context) (stop bool) {
	if !s.firstRunCatchUp {
		return false
	}
	for {
		err := s.recordCatchUp(ctx)
		if err == nil {
			return false
		}
		if ctx.Err() != nil {
			return true
		}
		s.logger.Error("subscriber: recording the first start's catch-up failed; will retry", "subscriber", s.name, "error", err)
		t := time.NewTimer(s.pollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return true
		case <-t.C:
		}
	}
}

// recordCatchUp makes one attempt at recording the catch-up of the name's
// first start (WithFirstRunCatchUp): startCatchUp's, and a Group's first
// cycle of the name for a tenant.
func (s *Subscriber) recordCatchUp(ctx context.Context) error {
	marker := s.checkpoints.(DeliveryMarker) // validateCatchUp
	head, err := s.events.HeadPosition(ctx)
	if err == nil && head > s.firstRunThreshold {
		err = marker.StartCatchUp(ctx, s.name, []string{s.name, partitionMarker(s.name)}, head)
	}
	return err
}
