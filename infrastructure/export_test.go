package infrastructure

// PortableAppendOnly makes s use the portable (database/sql) append path
// instead of the pipelined pgx one, so tests can cover both.
func PortableAppendOnly(s *GormEventStore) { s.portableOnly = true }

// FormingAppends is the number of appends of s waiting in batches that
// form behind the ones in flight (0 when none waits).
func FormingAppends(s *GormEventStore) int {
	s.coalescer.mu.Lock()
	defer s.coalescer.mu.Unlock()
	n := 0
	for _, b := range s.coalescer.forming {
		n += len(b.members)
	}
	return n
}
