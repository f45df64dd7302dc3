package subscriptions

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/eventfeed/subscriptions/domain"
)

// ErrEventNotParked is returned by Replay when the event is not parked for
// the subscriber.
var ErrEventNotParked = errors.New("event is not parked")

// ErrReplayInProgress is returned by Replay, on every ParkingLot, when
// another replay of the same entry is running: the handler runs at most
// once per parked entry, so the second replay conflicts instead of running
// it again (or waiting to find the entry gone). The handler did not run;
// the entry stays parked unless the other replay clears it, so retrying
// later answers either nil or ErrEventNotParked.
var ErrReplayInProgress = errors.New("a replay of the event is already in progress")

// ErrParkedAfterCheckpoint is returned by Subscriber.ReplayParked for a
// parked event whose position is after the subscriber's checkpoint (the
// checkpoint was reset before it): the subscriber will deliver the event
// again, and a replay as well would handle it twice.
var ErrParkedAfterCheckpoint = errors.New("the parked event is after the checkpoint: the subscriber will deliver it again")

// DeliveredClearer is the optional capability of a ParkingLot that
// removes the entries of events a live batch handled, so that no entry
// outlives its event's successful handling (it would be listed, and
// replayed, a second time): after a reset the subscriber delivers parked
// events again, and a success there is final (see the package
// documentation, Failures). The run loop calls ClearDelivered with every
// batch it commits: in the batch's transaction when ClearsInBatch says the
// lot joins it (a failure there fails the commit), else right after the
// commit (a failure is logged; the entry stays until a later delivery or
// replay). Without it parked entries stay until replayed or discarded, and
// ReplayParked of an event the subscriber handled again handles it twice.
// This package's lots have it.
type DeliveredClearer interface {
	// ClearDelivered removes subscriber's entries with positions in
	// (after, upTo], except one whose replay is running, through the batch
	// transaction when ctx carries one of the lot's database (see Park).
	ClearDelivered(ctx context.Context, subscriber string, after, upTo int64) error
	// ClearsInBatch reports whether ClearDelivered(ctx, ...) runs in the
	// batch transaction ctx carries.
	ClearsInBatch(ctx context.Context) bool
}

// ErrParkingLotNotManaged is returned by the Subscriber methods that
// manage parked events (GetParked, ListParkedPage, DiscardParked,
// ReplayParkedMatching) when the subscriber's ParkingLot does not
// implement ManagedParkingLot.
var ErrParkingLotNotManaged = errors.New("parking lot does not implement ManagedParkingLot")

// ParkedEvent records an event a subscriber could not process after
// exhausting its retries.
type ParkedEvent struct {
	Subscriber string    `json:"subscriber"`
	EventID    string    `json:"event_id"`
	EventType  string    `json:"event_type"`
	Position   int64     `json:"position"`
	Error      string    `json:"error"`
	Attempts   int       `json:"attempts"`
	ParkedAt   time.Time `json:"parked_at"`
	// AggregateID is the parked event's aggregate, so that an operator can
	// filter by it (ListParkedPage, ReplayParkedMatching). Empty for
	// entries parked before the field existed.
	AggregateID string `json:"aggregate_id"`
	// HeldBy, on an entry held behind its aggregate's queue (see
	// WithOrderedParking), is the event ID of the queue's head, which
	// holds it; empty for an entry parked for its own failure. The lot
	// sets it on reads; Park ignores it (OrderedParkingLot.Hold holds).
	HeldBy string `json:"held_by,omitempty"`
}

// ParkingLot stores poison events so one unprocessable event never blocks
// the events behind it: the subscriber parks it and advances the
// checkpoint past it. ManagedParkingLot adds what operators need
// (package admin and cmd/subscriptions are surfaces over both).
//
// Implementations are safe for concurrent use.
type ParkingLot interface {
	// Park records a poison event. When ctx carries a batch transaction
	// (TxFromContext), the row is written through it so the parking and the
	// checkpoint advance past the event commit atomically.
	Park(ctx context.Context, parked ParkedEvent) error

	// List returns the subscriber's parked events ordered by position.
	List(ctx context.Context, subscriber string) ([]ParkedEvent, error)

	// Replay re-runs handler for a parked event and clears the row on
	// success. Database-backed implementations run both in one transaction
	// (with the transaction exposed to the handler via TxFromContext), so a
	// failed replay leaves the row — and any handler writes — untouched.
	// Returns ErrEventNotParked when the event is not parked, and
	// ErrReplayInProgress, without running handler, when another replay
	// of the same entry is running.
	Replay(ctx context.Context, subscriber, eventID string, event domain.EventEnvelope[any], handler Handler) error
}

// ParkingLotPurger is implemented by parking lots that can delete all of a
// subscriber's parked events, which Subscriber.DeleteState needs to retire
// a subscriber name. GormParkingLot and MemoryParkingLot implement it; the
// ParkingLot interface itself is unchanged.
//
// Implementations are safe for concurrent use. Purge is not ordered with
// a Park of the same subscriber running at the same time (the new entry
// may survive it); DeleteState rules that out by holding off the name's
// batches, in which parking happens, while it purges.
type ParkingLotPurger interface {
	ParkingLot

	// Purge deletes every event parked for subscriber. When ctx carries a
	// transaction of the lot's own database (TxFromContext), the delete is
	// written through it, so it commits or rolls back with that
	// transaction.
	Purge(ctx context.Context, subscriber string) error
}

// validateParked refuses an entry no parking lot could keep exactly: every
// lot checks it before parking (ValidateParked, with this package's prefix).
func validateParked(p ParkedEvent) error {
	if err := ValidateParked(p); err != nil {
		return fmt.Errorf("subscriptions: %w", err)
	}
	return nil
}
