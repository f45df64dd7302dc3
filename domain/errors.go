package domain

import "errors"

// Sentinel errors returned (wrapped, with the offending event or argument
// named) by EventStore implementations. Callers branch on them with
// errors.Is.
var (
	// ErrEventNotFound is returned by GetEventByID for an unknown ID.
	ErrEventNotFound = errors.New("event not found")

	// ErrConcurrencyConflict is returned by Append when expectedVersion does
	// not match the aggregate's current version (or another writer stored
	// the same sequence number first). Nothing is persisted.
	ErrConcurrencyConflict = errors.New("concurrency conflict")

	// ErrInvalidEvent marks malformed input: an empty aggregate ID, event
	// type, event ID or transaction ID, a payload that cannot be stored as
	// JSON, and so on. Nothing is persisted.
	ErrInvalidEvent = errors.New("invalid event")

	// ErrAlreadyAppended is returned by Append when every event of the call
	// is already stored exactly as given: same event IDs, aggregate,
	// sequence numbers (or, where the call left them 0, consecutive ones),
	// event types, transaction IDs and payloads. It marks the retry of an
	// append that committed although the caller never saw it succeed (the
	// connection dropped during COMMIT, or the context expired after the
	// commit), so callers treat it as success. Nothing is stored again.
	// Metadata and Created are not compared: instrumentation may
	// legitimately differ between attempts. An event ID that is stored with
	// different content is ErrInvalidEvent, as before.
	ErrAlreadyAppended = errors.New("events already appended")

	// ErrGlobalOrderingNotSupported is returned by ReadAfter and
	// HeadPosition on a store (or database dialect) without a global,
	// gap-safe commit order. Subscribers cannot run on such a store.
	ErrGlobalOrderingNotSupported = errors.New("global event ordering not supported")
)
