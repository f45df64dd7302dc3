package domain

import (
	"time"

	"github.com/google/uuid"
)

// EventEnvelope wraps a domain event payload with the metadata an event
// store needs to persist and order it.
//
// An envelope is a plain value: it is safe to copy, and safe for concurrent
// reads as long as nobody mutates Payload or Metadata, which the stores in
// this module never do after Append returns.
type EventEnvelope[T any] struct {
	ID            string         `json:"id"`
	AggregateID   string         `json:"aggregate_id"`
	EventType     string         `json:"event_type"`
	Payload       T              `json:"payload"`
	Created       time.Time      `json:"timestamp"`
	SequenceNo    int            `json:"sequence_no"`
	TransactionID string         `json:"transaction_id,omitempty"`
	Metadata      map[string]any `json:"metadata,omitempty"`
	// Position is the event's place in the store's global, cross-aggregate
	// commit order: assigned by the store when the event is persisted,
	// filled in on reads, zero on envelopes not yet persisted. Strictly
	// increasing in feed order, not necessarily dense.
	Position int64 `json:"position,omitempty"`
}

// identifiable is satisfied by payloads that know their aggregate's ID.
type identifiable interface {
	GetID() string
}

// NewEventEnvelope creates an envelope with a fresh UUIDv7 ID (unique and
// time-ordered, so IDs sort roughly by creation), Created set to now and an
// empty, non-nil Metadata map. If payload has a GetID() string method, its
// result is the aggregate ID and aggregateID is ignored. sequenceNo 0 lets
// the store number the event on Append (see EventStore.Append); any other
// value is checked to be the aggregate's next number.
func NewEventEnvelope[T any](payload T, aggregateID, eventType string, sequenceNo int) EventEnvelope[T] {
	if p, ok := any(payload).(identifiable); ok && p != nil {
		if id := safeGetID(p); id != "" {
			aggregateID = id
		}
	}
	return EventEnvelope[T]{
		ID:          newEventID(),
		AggregateID: aggregateID,
		EventType:   eventType,
		Payload:     payload,
		Created:     time.Now().UTC(),
		SequenceNo:  sequenceNo,
		Metadata:    map[string]any{},
	}
}

// safeGetID calls GetID, treating a panic (a nil pointer receiver, say) as
// "no ID" so that NewEventEnvelope never panics on odd payloads.
func safeGetID(p identifiable) (id string) {
	defer func() {
		if recover() != nil {
			id = ""
		}
	}()
	return p.GetID()
}

// newEventID returns a UUIDv7. uuid.NewV7 only fails when the system's
// random source fails; falling back to a V4 keeps IDs unique in that case.
func newEventID() string {
	id, err := uuid.NewV7()
	if err != nil {
		return uuid.NewString()
	}
	return id.String()
}

// ToAnyEnvelope converts a typed envelope to EventEnvelope[any], copying
// every field, Position included. The Metadata map is shared, not cloned.
func ToAnyEnvelope[T any](envelope EventEnvelope[T]) EventEnvelope[any] {
	return EventEnvelope[any]{
		ID:            envelope.ID,
		AggregateID:   envelope.AggregateID,
		EventType:     envelope.EventType,
		Payload:       envelope.Payload,
		Created:       envelope.Created,
		SequenceNo:    envelope.SequenceNo,
		TransactionID: envelope.TransactionID,
		Metadata:      envelope.Metadata,
		Position:      envelope.Position,
	}
}
