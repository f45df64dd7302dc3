package infrastructure

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/eventfeed/subscriptions/domain"
)

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

// ExplainRefusal is the answer for an append of events to aggregateID
// that inserted nothing in a committed batch, read on pc (see
// explainRefusals).
func ExplainRefusal(ctx context.Context, pc *pgx.Conn, aggregateID string, expectedVersion int, events ...domain.EventEnvelope[any]) error {
	prepared, err := prepareAppend(aggregateID, expectedVersion, -1, events)
	if err != nil {
		return err
	}
	m := &appendRequest{ctx: ctx, aggregateID: aggregateID, expectedVersion: expectedVersion, events: events, prepared: prepared}
	results := map[*appendRequest]error{}
	explainRefusals(ctx, pc, []*appendRequest{m}, results)
	return results[m]
}

// AppendsInFlightLimit is the number of append transactions s keeps in
// flight at present (see appendCoalescer.limit).
func AppendsInFlightLimit(s *GormEventStore) int {
	s.coalescer.mu.Lock()
	defer s.coalescer.mu.Unlock()
	return s.coalescer.limit()
}
