package domain

import "context"

// EventStore persists event streams per aggregate and exposes a global,
// cross-aggregate ordered feed (ReadAfter) that background subscribers treat
// as a durable queue.
//
// Implementations are safe for concurrent use. Every error caused by bad
// input wraps one of the sentinel errors of this package and names the
// offending event or argument. Lists are empty slices, never nil, when
// nothing matches.
type EventStore interface {
	// Append persists events for one aggregate atomically. expectedVersion is
	// the aggregate's current version the caller saw; -1 skips the check.
	// A mismatch returns ErrConcurrencyConflict and persists nothing.
	//
	// Sequence numbers: an aggregate's events are numbered 1, 2, 3, ...
	// without gaps, and its version is the number of its last event. An
	// envelope whose SequenceNo is 0 is given the next number (the stored
	// version plus its place in this append), which is what
	// NewEventEnvelope(payload, id, type, 0) asks for. A non-zero SequenceNo
	// is checked instead: a number already stored returns
	// ErrConcurrencyConflict (another writer appended first), a negative
	// one or any other than the next returns ErrInvalidEvent. Envelopes read
	// back always carry their stored number.
	//
	// An error does not always mean nothing was stored: when the connection
	// drops during the commit, or ctx expires while the commit is under way,
	// Append can return that error (context.DeadlineExceeded, say) although
	// the events committed. Retrying the same call is safe: if the first
	// attempt committed, the retry stores nothing and returns an error
	// wrapping ErrAlreadyAppended, which the caller treats as success. Keep
	// the envelopes (their IDs) of a failed call for the retry; fresh
	// envelopes would be appended again, or conflict.
	Append(ctx context.Context, aggregateID string, expectedVersion int, events ...EventEnvelope[any]) error
	GetEvents(ctx context.Context, aggregateID string) ([]EventEnvelope[any], error)
	GetEventsFromVersion(ctx context.Context, aggregateID string, fromVersion int) ([]EventEnvelope[any], error)
	// fromVersion -1 means 1; toVersion -1 means to the end.
	GetEventsRange(ctx context.Context, aggregateID string, fromVersion, toVersion int) ([]EventEnvelope[any], error)
	GetEventByID(ctx context.Context, eventID string) (EventEnvelope[any], error)
	// Ordered by aggregate ID, then sequence number. Empty ID: ErrInvalidEvent.
	GetEventsByTransactionID(ctx context.Context, transactionID string) ([]EventEnvelope[any], error)
	// 0 when the aggregate does not exist.
	GetCurrentVersion(ctx context.Context, aggregateID string) (int, error)
	// Committed events of all aggregates with Position > afterPosition,
	// ascending by Position, at most limit (limit <= 0: no limit). A
	// position is never returned while an event with a smaller position can
	// still commit, so a reader that remembers the last position it saw
	// never skips an event.
	ReadAfter(ctx context.Context, afterPosition int64, limit int) ([]EventEnvelope[any], error)
	// The highest Position that ReadAfter could deliver now; 0 when empty.
	HeadPosition(ctx context.Context) (int64, error)
	Close() error
}
