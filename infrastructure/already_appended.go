package infrastructure

import (
	"fmt"
	"reflect"

	"github.com/eventfeed/subscriptions/domain"
)

// storedEvent is what the identical-retry check compares of a stored
// event (see domain.ErrAlreadyAppended).
type storedEvent struct {
	ID            string
	AggregateID   string
	EventType     string
	TransactionID string
	SequenceNo    int
	Payload       []byte // JSON
}

// checkStoredIDs tells an append whose event IDs may already be stored
// apart from a new one, given the stored events among its IDs: nil when
// none is stored; an error wrapping domain.ErrAlreadyAppended when every
// event is stored exactly as given (a retry of an append that committed);
// an error wrapping domain.ErrInvalidEvent when some ID is stored with
// other content or another sequence number than the call asks for
// (expectedVersion included), or only some of them are stored.
//
// Every store calls it with the events' IDs looked up where they cannot
// change under it (under its lock or write transaction), before the
// version check: a retry's expectedVersion is stale by construction.
// events must have passed prepareAppend.
func checkStoredIDs(aggregateID string, expectedVersion int, events []domain.EventEnvelope[any], stored map[string]storedEvent) error {
	// stored may hold other appends' events too (a coalesced batch).
	var found []storedEvent
	for _, ev := range events {
		if s, ok := stored[ev.ID]; ok {
			found = append(found, s)
		}
	}
	switch {
	case len(found) == 0:
		return nil
	case len(found) < len(events):
		// Some IDs stored, some not: not the retry of one append.
		s := found[0]
		return fmt.Errorf("%w: aggregate %q: an event ID is already stored: event %q (aggregate %q, version %d), while other events of the append are new", domain.ErrInvalidEvent, aggregateID, s.ID, s.AggregateID, s.SequenceNo)
	}
	// The sequence numbers the call asks for: its own, or the ones after
	// expectedVersion; with neither (-1 and zeros), any consecutive ones.
	firstSeq := expectedVersion + 1
	for i, ev := range events {
		got := stored[ev.ID]
		where := eventRef{aggregateID, i + 1, ev.ID}
		if i == 0 && expectedVersion == -1 {
			firstSeq = got.SequenceNo
		}
		var differs string
		switch {
		case got.AggregateID != aggregateID:
			differs = fmt.Sprintf("aggregate %q", got.AggregateID)
		case ev.SequenceNo != 0 && ev.SequenceNo != got.SequenceNo,
			ev.SequenceNo == 0 && got.SequenceNo != firstSeq+i:
			differs = fmt.Sprintf("sequence number %d", got.SequenceNo)
		case got.EventType != ev.EventType:
			differs = fmt.Sprintf("event type %q", got.EventType)
		case got.TransactionID != ev.TransactionID:
			differs = fmt.Sprintf("transaction ID %q", got.TransactionID)
		default:
			if !samePayload(ev.Payload, got.Payload) {
				differs = "another payload"
			}
		}
		if differs != "" {
			return fmt.Errorf("%w: %s: an event ID is already stored, with %s", domain.ErrInvalidEvent, where, differs)
		}
	}
	return fmt.Errorf("%w: aggregate %q: the %d event(s) from ID %q (version %d) are stored exactly as given: the retry of an append that committed", domain.ErrAlreadyAppended, aggregateID, len(events), events[0].ID, firstSeq)
}

// samePayload compares a payload as given with a stored one through their
// decoded JSON, so that a database's normalisation (jsonb reorders keys
// and drops whitespace) does not matter.
func samePayload(given any, stored []byte) bool {
	encoded, err := encodeJSON(given)
	if err != nil {
		return false
	}
	a, errA := decodeJSON(encoded)
	b, errB := decodeJSON(stored)
	return errA == nil && errB == nil && reflect.DeepEqual(a, b)
}
