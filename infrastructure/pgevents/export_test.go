package pgevents

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/eventfeed/subscriptions/domain"
)

// ExplainRefusal is the answer for an append of events to aggregateID
// that inserted nothing in a committed batch, read on pc (see
// explainRefusals).
func ExplainRefusal(ctx context.Context, pc *pgx.Conn, aggregateID string, expectedVersion int, events ...domain.EventEnvelope[any]) error {
	prepared, err := PrepareAppend(aggregateID, expectedVersion, -1, events)
	if err != nil {
		return err
	}
	m := &appendRequest{ctx: ctx, aggregateID: aggregateID, expectedVersion: expectedVersion, events: events, prepared: prepared}
	results := map[*appendRequest]error{}
	explainRefusals(ctx, pc, searchPathTable.sql, []*appendRequest{m}, results)
	return results[m]
}
