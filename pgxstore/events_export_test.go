package pgxstore

// SetAppendCoalescing turns the coalescing of concurrent appends on or
// off (on by default), for tests and benchmarks that compare the two. Call
// it before the store's first append.
func SetAppendCoalescing(s *EventStore, on bool) { s.appender.SetCoalescing(on) }

// FormingAppends is the number of appends waiting in batches that have
// not been sent yet.
func FormingAppends(s *EventStore) int { return s.appender.Waiting() }
