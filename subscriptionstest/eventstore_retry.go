package subscriptionstest

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/feedtest"
)

// testIdenticalRetry retries appends that committed: the retry of the
// same events is recognisable (domain.ErrAlreadyAppended) and stores
// nothing; anything else under a stored event ID stays an error.
func testIdenticalRetry(t *testing.T, s domain.EventStore) {
	ctx := feedtest.Context(t)
	agg := feedtest.UniqueID("retry")
	tx := feedtest.UniqueID("retry-tx")
	first := feedtest.NewEvent(agg, "opened", map[string]any{"owner": "ann", "limit": 10})
	second := feedtest.NewEvent(agg, "deposited", []any{1.5, "x"})
	first.TransactionID, second.TransactionID = tx, tx
	require.NoError(t, s.Append(ctx, agg, 0, first, second))
	stored, err := s.GetEvents(ctx, agg)
	require.NoError(t, err)
	before := stateOf(t, s, agg)
	head, err := s.HeadPosition(ctx)
	require.NoError(t, err)

	with := func(e domain.EventEnvelope[any], change func(*domain.EventEnvelope[any])) domain.EventEnvelope[any] {
		e.Metadata = map[string]any{}
		change(&e)
		return e
	}
	same := func(*domain.EventEnvelope[any]) {}
	cases := []struct {
		name            string
		expectedVersion int
		events          []domain.EventEnvelope[any]
		want            error
	}{
		{"same call", 0, []domain.EventEnvelope[any]{first, second}, domain.ErrAlreadyAppended},
		{"version check skipped", -1, []domain.EventEnvelope[any]{first, second}, domain.ErrAlreadyAppended},
		{"the envelopes read back", 0, stored, domain.ErrAlreadyAppended},
		{"other metadata (not compared)", 0, []domain.EventEnvelope[any]{
			with(first, func(e *domain.EventEnvelope[any]) { e.Metadata = map[string]any{"trace": "retry"} }), second,
		}, domain.ErrAlreadyAppended},
		{"another payload", 0, []domain.EventEnvelope[any]{
			with(first, func(e *domain.EventEnvelope[any]) { e.Payload = map[string]any{"owner": "bob", "limit": 10} }), second,
		}, domain.ErrInvalidEvent},
		{"another event type", 0, []domain.EventEnvelope[any]{first, with(second, func(e *domain.EventEnvelope[any]) { e.EventType = "withdrawn" })}, domain.ErrInvalidEvent},
		{"another transaction ID", 0, []domain.EventEnvelope[any]{first, with(second, func(e *domain.EventEnvelope[any]) { e.TransactionID = "other" })}, domain.ErrInvalidEvent},
		{"another order", -1, []domain.EventEnvelope[any]{second, first}, domain.ErrInvalidEvent},
		{"another expected version", 2, []domain.EventEnvelope[any]{first, second}, domain.ErrInvalidEvent},
		{"other sequence numbers", -1, []domain.EventEnvelope[any]{
			with(first, func(e *domain.EventEnvelope[any]) { e.SequenceNo = 3 }), with(second, func(e *domain.EventEnvelope[any]) { e.SequenceNo = 4 }),
		}, domain.ErrInvalidEvent},
		{"a stored and a new event", 2, []domain.EventEnvelope[any]{with(second, same), feedtest.NewEvent(agg, "new", nil)}, domain.ErrInvalidEvent},
		{"under another aggregate", 0, []domain.EventEnvelope[any]{
			with(first, func(e *domain.EventEnvelope[any]) { e.AggregateID = "" }),
		}, domain.ErrInvalidEvent},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			target := agg
			if c.name == "under another aggregate" {
				target = feedtest.UniqueID("retry-other")
			}
			err := s.Append(ctx, target, c.expectedVersion, c.events...)
			require.ErrorIs(t, err, c.want)
			for _, other := range []error{domain.ErrAlreadyAppended, domain.ErrInvalidEvent, domain.ErrConcurrencyConflict} {
				if other != c.want {
					require.NotErrorIs(t, err, other)
				}
			}
			require.Contains(t, err.Error(), target)
			require.Equal(t, before, stateOf(t, s, agg), "nothing is stored again")
			now, err := s.HeadPosition(ctx)
			require.NoError(t, err)
			require.Equal(t, head, now, "the feed did not move")
		})
	}
	// A conflicting append that is not a retry is still a conflict.
	err = s.Append(ctx, agg, 0, feedtest.NewEvent(agg, "late", nil))
	require.ErrorIs(t, err, domain.ErrConcurrencyConflict)
	require.NotErrorIs(t, err, domain.ErrAlreadyAppended)
}

// testRetryExactNumbers retries appends whose payloads hold numbers a
// float64 cannot tell apart or cannot hold: a retry is recognised by the
// numbers' exact values (whatever notation the store keeps them in), and a
// payload that differs in the last digit is another event.
func testRetryExactNumbers(t *testing.T, s domain.EventStore) {
	ctx := feedtest.Context(t)
	cases := []struct {
		name, stored, retried string
		want                  error
	}{
		{"a digit past float64 precision", `{"amount": 9007199254740993}`, `{"amount": 9007199254740992}`, domain.ErrInvalidEvent},
		{"the same big integer", `{"amount": 9007199254740993}`, `{"amount": 9007199254740993}`, domain.ErrAlreadyAppended},
		{"the largest float64 (jsonb writes out its 309 digits)", `{"x": 1.7976931348623157e308}`, `{"x": 1.7976931348623157e308}`, domain.ErrAlreadyAppended},
		{"a digit past float64 precision near its largest", `{"x": 1.7976931348623157e308}`, `{"x": 1.7976931348623156e308}`, domain.ErrInvalidEvent},
		{"another notation of one value", `[1.50, 100, -0.0]`, `[15e-1, 1e2, 0]`, domain.ErrAlreadyAppended},
		{"a tiny difference", `[0.1000000000000000000001]`, `[0.1]`, domain.ErrInvalidEvent},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			agg := feedtest.UniqueID("retry-num")
			ev := feedtest.NewEvent(agg, "counted", json.RawMessage(c.stored))
			require.NoError(t, s.Append(ctx, agg, 0, ev))
			ev.Payload = json.RawMessage(c.retried)
			err := s.Append(ctx, agg, 0, ev)
			require.ErrorIs(t, err, c.want)
			events, err := s.GetEvents(ctx, agg)
			require.NoError(t, err)
			require.Len(t, events, 1, "nothing is stored again")
		})
	}
}

// testLargeAppend appends more events in one call than one INSERT
// carries: all or nothing, numbered consecutively, contiguous in the feed.
func testLargeAppend(t *testing.T, s domain.EventStore) {
	ctx := feedtest.Context(t)
	agg := feedtest.UniqueID("large")
	const n = 2345
	batch := func(count int) []domain.EventEnvelope[any] {
		out := make([]domain.EventEnvelope[any], count)
		for i := range out {
			out[i] = feedtest.NewEvent(agg, "x", i)
		}
		return out
	}
	require.NoError(t, s.Append(ctx, agg, 0, batch(1)...))
	before := stateOf(t, s, agg)
	err := s.Append(ctx, agg, 0, batch(n)...)
	require.ErrorIs(t, err, domain.ErrConcurrencyConflict, "a stale version stores no chunk")
	require.Equal(t, before, stateOf(t, s, agg))

	require.NoError(t, s.Append(ctx, agg, -1, batch(n)...))
	require.NoError(t, s.Append(ctx, agg, n+1, batch(1)...))
	events, err := s.GetEvents(ctx, agg)
	require.NoError(t, err)
	require.Len(t, events, n+2)
	for i, e := range events {
		require.Equal(t, i+1, e.SequenceNo)
		if i > 1 && i <= n {
			require.Equal(t, events[i-1].Position+1, e.Position, "one append's events are contiguous")
		}
	}
	feed, err := s.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	feedtest.RequireStrictlyIncreasing(t, feed)
}
