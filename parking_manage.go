package subscriptions

import (
	"context"
	"time"
)

// ParkedFilter selects parked events for ListParkedPage and
// ReplayParkedMatching. The zero value selects every parked event of the
// subscriber.
type ParkedFilter struct {
	// EventType, when not empty, keeps only events of exactly this type.
	EventType string `json:"event_type,omitempty"`
	// AggregateID, when not empty, keeps only events of exactly this
	// aggregate.
	AggregateID string `json:"aggregate_id,omitempty"`
	// AfterPosition is the paging cursor: only events with a greater
	// position are returned (events are listed in position order, and a
	// position names one event).
	AfterPosition int64 `json:"after_position,omitempty"`
	// Limit caps the number of events returned; 0 or less means no cap.
	Limit int `json:"limit,omitempty"`
}

// ManagedParkingLot is the optional interface of a ParkingLot that an
// operator can manage: look at one entry, list with a filter and a
// cursor, discard an entry, and record a failed replay. MemoryParkingLot
// and GormParkingLot implement it; the Subscriber methods that need it
// (GetParked, ListParkedPage, DiscardParked, ReplayParkedMatching) return
// an error wrapping ErrParkingLotNotManaged for a lot that does not.
// ParkingLot itself is unchanged, so existing implementations keep
// compiling.
//
// Implementations are safe for concurrent use.
type ManagedParkingLot interface {
	ParkingLot

	// Get returns one parked entry, or an error wrapping ErrEventNotParked.
	Get(ctx context.Context, subscriber, eventID string) (ParkedEvent, error)

	// ListFiltered returns the subscriber's parked events that match
	// filter, ordered by position (then event ID), at most filter.Limit.
	// The result is never nil.
	ListFiltered(ctx context.Context, subscriber string, filter ParkedFilter) ([]ParkedEvent, error)

	// Discard removes a parked entry without running any handler and
	// returns it as it was. An entry that is not parked returns an error
	// wrapping ErrEventNotParked; one being replayed, an error wrapping
	// ErrReplayInProgress (the answer a second replay gets, with the same
	// exceptions: see the module's lots).
	Discard(ctx context.Context, subscriber, eventID string) (ParkedEvent, error)

	// RecordReplayFailure records a failed replay on the entry: one more
	// attempt, the replay's error and its time (in ParkedAt). An entry that
	// is no longer parked is left alone and is not an error: a concurrent
	// replay may have cleared it.
	RecordReplayFailure(ctx context.Context, subscriber, eventID, errText string, at time.Time) error
}
