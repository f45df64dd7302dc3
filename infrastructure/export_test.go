package infrastructure

// PortableAppendOnly makes s use the portable (database/sql) append path
// instead of the pipelined pgx one, and GORM's reads instead of pgx's, so
// tests can cover both.
func PortableAppendOnly(s *GormEventStore) { s.portableOnly = true }

// FormingAppends is the number of appends of s waiting in batches that
// form behind the ones in flight (0 when none waits).
func FormingAppends(s *GormEventStore) int { return s.appender.Waiting() }

// AppendsInFlightLimit is the number of append transactions s keeps in
// flight at present (see pgevents.Appender.InFlightLimit).
func AppendsInFlightLimit(s *GormEventStore) int { return s.appender.InFlightLimit() }
