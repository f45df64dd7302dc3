package infrastructure

// PortableAppendOnly makes s use the portable (database/sql) append path
// instead of the pipelined pgx one, so tests can cover both.
func PortableAppendOnly(s *GormEventStore) { s.portableOnly = true }
