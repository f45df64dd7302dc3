// Package pgevents is the engine-level core of the Postgres event store,
// shared by infrastructure's GORM store (infrastructure.GormEventStore)
// and package pgxstore, so that both append, validate, retry and decode
// alike on one events table: the validation and JSON encoding of an
// append (PrepareAppend), the recognition of a retried append as already
// appended (CheckStoredIDs), the pipelined append transaction on a pgx
// connection with the coalescing of concurrent appends into one
// transaction (Appender), and the decoding of a stored row into the
// envelope readers see (Row), all on one events table (Table: the
// search_path's or a schema's, its append lock keyed by the table's
// canonical name). A backend of one's own may use it too.
//
// It imports no GORM, directly or not, and works on pgx connections, not
// database/sql ones: it imports only the standard library, pgx v5, the
// module's domain and migrations/schema packages, and two of its internal
// ones (the identifier rules every store shares, and the process-wide
// coalescing switches of cmd/subbench); a test keeps it so. Everything
// here is safe for concurrent use unless its documentation says
// otherwise.
package pgevents
