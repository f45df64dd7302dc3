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

// TestAppend is one append of RunAppendTransaction.
type TestAppend struct {
	AggregateID     string
	ExpectedVersion int
	Events          []domain.EventEnvelope[any]
}

// RunAppendTransaction runs appends as one append transaction on pc (the
// bare events table), notifying channel when notify is set, and returns
// each append's outcome, in order.
func RunAppendTransaction(ctx context.Context, pc *pgx.Conn, channel string, notify bool, appends ...TestAppend) ([]error, error) {
	a := NewAppender(searchPathTable, channel, nil)
	members := make([]*appendRequest, len(appends))
	for i, ap := range appends {
		prepared, err := PrepareAppend(ap.AggregateID, ap.ExpectedVersion, -1, ap.Events)
		if err != nil {
			return nil, err
		}
		members[i] = &appendRequest{ctx: ctx, aggregateID: ap.AggregateID, expectedVersion: ap.ExpectedVersion, events: ap.Events, prepared: prepared}
	}
	results := a.appendOnConn(ctx, pc, members, notify)
	out := make([]error, len(members))
	for i, m := range members {
		out[i] = results[m]
	}
	return out, endSession(ctx, pc)
}
