package infrastructure

// PortableAppendOnly makes s use the portable (database/sql) append path
// instead of the pipelined pgx one, so tests can cover both.
func PortableAppendOnly(s *GormEventStore) { s.portableOnly = true }

// FormingAppends is the number of appends in s's batch that waits for the
// append lock (0 when none waits).
func FormingAppends(s *GormEventStore) int {
	s.coalescer.mu.Lock()
	defer s.coalescer.mu.Unlock()
	if s.coalescer.forming == nil {
		return 0
	}
	return len(s.coalescer.forming.members)
}
