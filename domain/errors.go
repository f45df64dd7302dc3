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

	// ErrGlobalOrderingNotSupported is returned by ReadAfter and
	// HeadPosition on a store (or database dialect) without a global,
	// gap-safe commit order. Subscribers cannot run on such a store.
	ErrGlobalOrderingNotSupported = errors.New("global event ordering not supported")
)
