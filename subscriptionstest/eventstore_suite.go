package subscriptionstest

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"math/big"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/feedtest"
)

// EventStoreHarness tells RunEventStoreSuite how to build the
// domain.EventStore under test.
type EventStoreHarness struct {
	// Name names the subtest the suite runs in ("memory", "postgres", ...).
	Name string
	// New returns a fresh, empty store for one test. Release what it
	// opens (and close the store) with t.Cleanup.
	New func(t *testing.T) domain.EventStore
	// MaxIdentifierBytes is the store's bound on event IDs, aggregate IDs,
	// event types and transaction IDs: identifiers of that many bytes must
	// be stored exactly, longer ones refused with domain.ErrInvalidEvent.
	// Zero means the store has no bound, and the bound's cases are skipped.
	// This module's stores use infrastructure.MaxIdentifierBytes.
	MaxIdentifierBytes int
	// Parallel runs this backend's cases alongside the test binary's other
	// parallel tests (t.Parallel on the Name subtest, so that the suites of
	// several backends overlap while each waits on its database). Set it
	// when New's stores share nothing with other tests, e.g. a database or
	// schema of their own. The cases of one backend still run one after
	// another.
	Parallel bool
}

// storeBackend is the harness as the cases read it.
type storeBackend struct {
	name string
	open func(t *testing.T) domain.EventStore
}

// RunEventStoreSuite runs the behavioural contract of domain.EventStore
// against the store h builds, as subtests of t named h.Name/<case>: what
// one store answers, all must answer. Every case gets a fresh store from
// h.New. Cases run one after another; a case may run goroutines of its
// own, all ended before it returns.
func RunEventStoreSuite(t *testing.T, h EventStoreHarness) {
	max := h.MaxIdentifierBytes
	cases := []struct {
		name string
		run  func(t *testing.T, s domain.EventStore)
	}{
		{"PayloadRoundTrip", testPayloadRoundTrip},
		{"EnvelopeFieldsRoundTrip", testEnvelopeFieldsRoundTrip},
		{"MetadataRoundTrip", testMetadataRoundTrip},
		{"ExpectedVersion", testExpectedVersion},
		{"ExpectedVersionWithoutEvents", testExpectedVersionWithoutEvents},
		{"ConcurrentAppendsOneWinner", testConcurrentAppendsOneWinner},
		{"SequenceNumbers", testSequenceNumbers},
		{"GetEventsRanges", testGetEventsRanges},
		{"GetEventByID", testGetEventByID},
		{"GetEventsByTransactionID", testGetEventsByTransactionID},
		{"GetCurrentVersion", testGetCurrentVersion},
		{"InvalidAppends", testInvalidAppends},
		{"InvalidReadArguments", func(t *testing.T, s domain.EventStore) { testInvalidReadArguments(t, s, max) }},
		{"DuplicateEventID", testDuplicateEventID},
		{"IdenticalRetry", testIdenticalRetry},
		{"RetryExactNumbers", testRetryExactNumbers},
		{"LargeAppend", testLargeAppend},
		{"ReadAfterLimits", testReadAfterLimits},
		{"EmptyStore", testEmptyStore},
		{"IdentifierLimits", func(t *testing.T, s domain.EventStore) { testIdentifierLimits(t, s, max) }},
		{"LongUnicodeIdentifiers", func(t *testing.T, s domain.EventStore) { testLongUnicodeIdentifiers(t, s, max) }},
		{"CanceledContext", testCanceledContext},
		{"CreatedRange", testCreatedRange},
		{"NestingDepth", testNestingDepth},
	}
	// One backend; the loop keeps the cases where they were written.
	for _, b := range []storeBackend{{name: h.Name, open: h.New}} {
		t.Run(b.name, func(t *testing.T) {
			if h.Parallel {
				t.Parallel()
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) { c.run(t, b.open(t)) })
			}
		})
	}
	RunPartitionFeedSuite(t, h)
}

type payloadStruct struct {
	Name  string         `json:"name"`
	Count int            `json:"count"`
	Tags  []string       `json:"tags"`
	Extra map[string]any `json:"extra,omitempty"`
}

func testPayloadRoundTrip(t *testing.T, s domain.EventStore) {
	ctx := feedtest.Context(t)
	cases := []struct {
		name    string
		payload any
	}{
		{"object", map[string]any{"name": "x", "n": 1, "nested": map[string]any{"ok": true, "list": []any{1, "two", nil}}}},
		{"empty object", map[string]any{}},
		{"struct as object", payloadStruct{Name: "s", Count: 3, Tags: []string{"a", "b"}, Extra: map[string]any{"k": 1.5}}},
		{"pointer to struct", &payloadStruct{Name: "p", Tags: []string{}}},
		{"array", []any{1, "two", 3.5, true, nil, map[string]any{"k": "v"}, []any{}}},
		{"typed slice", []int{3, 2, 1}},
		{"empty array", []any{}},
		{"string", "hello"},
		{"empty string", ""},
		{"unicode string with quotes", "héllo \"wörld\" ; DROP TABLE events; -- 😀 \\ \u2028"},
		{"integer", 42},
		{"negative float", -12.625},
		{"large integer exact in float64", int64(1) << 52},
		{"zero", 0},
		{"true", true},
		{"false", false},
		{"null", nil},
		{"raw JSON object", json.RawMessage(`{"a": [1, 2, {"b": null}], "c": "d"}`)},
		{"raw JSON scalar", json.RawMessage(`17.25`)},
		{"raw JSON extreme numbers in range", json.RawMessage(`[1.7976931348623157e308, -5e-324, 123456789012345678901234567890, 0e16383, -0E-300, 0.5e-300, 0.000000001e5]`)},
		{"big integer within float64", new(big.Int).Lsh(big.NewInt(1), 1000)},
		{"bytes as base64", []byte{0, 1, 2, 255}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			agg := feedtest.UniqueID("payload")
			ev := feedtest.NewEvent(agg, "thing.happened", c.payload)
			require.NoError(t, s.Append(ctx, agg, 0, ev))

			byID, err := s.GetEventByID(ctx, ev.ID)
			require.NoError(t, err)
			requireJSONEqual(t, c.payload, byID.Payload, "GetEventByID payload")

			events, err := s.GetEvents(ctx, agg)
			require.NoError(t, err)
			require.Len(t, events, 1)
			requireJSONEqual(t, c.payload, events[0].Payload, "GetEvents payload")

			feed, err := s.ReadAfter(ctx, byID.Position-1, 1)
			require.NoError(t, err)
			require.Equal(t, []string{ev.ID}, feedtest.IDs(feed))
			requireJSONEqual(t, c.payload, feed[0].Payload, "ReadAfter payload")
		})
	}
}

func testEnvelopeFieldsRoundTrip(t *testing.T, s domain.EventStore) {
	ctx := feedtest.Context(t)
	agg := feedtest.UniqueID("fields")
	loc := time.FixedZone("UTC+5:30", 5*3600+1800)
	created := time.Date(2024, 2, 29, 23, 59, 58, 123456789, loc)
	ev := feedtest.NewEvent(agg, "order.placed", map[string]any{"total": 12.5})
	ev.Created = created
	ev.TransactionID = feedtest.UniqueID("tx")
	ev.Metadata = map[string]any{"user": "u1"}
	ev.Position = 999 // ignored: the store assigns positions

	before := time.Now().UTC().Add(-time.Second)
	noCreated := feedtest.NewEvent(agg, "order.paid", nil)
	noCreated.Created = time.Time{}
	require.NoError(t, s.Append(ctx, agg, 0, ev, noCreated))

	got, err := s.GetEvents(ctx, agg)
	require.NoError(t, err)
	require.Len(t, got, 2)
	e := got[0]
	require.Equal(t, ev.ID, e.ID)
	require.Equal(t, agg, e.AggregateID)
	require.Equal(t, "order.placed", e.EventType)
	require.Equal(t, 1, e.SequenceNo)
	require.Equal(t, ev.TransactionID, e.TransactionID)
	require.Positive(t, e.Position)
	require.NotEqual(t, int64(999), e.Position)
	require.Equal(t, time.UTC, e.Created.Location(), "Created is returned in UTC")
	require.True(t, created.Truncate(time.Microsecond).Equal(e.Created), "Created %v, want %v (microsecond precision)", e.Created, created)
	require.Equal(t, created.Truncate(time.Microsecond).UTC(), e.Created)
	requireJSONEqual(t, ev.Metadata, e.Metadata)

	// A zero Created is set by the store to the time of the append.
	require.Equal(t, "", got[1].TransactionID)
	require.False(t, got[1].Created.IsZero())
	require.True(t, got[1].Created.After(before), "Created %v is not around now", got[1].Created)
	require.True(t, got[1].Created.Before(time.Now().Add(time.Second)), "Created %v is not around now", got[1].Created)
	require.Equal(t, e.Position+1, got[1].Position)

	// The caller's envelope is not changed by the append.
	require.Equal(t, int64(999), ev.Position)
	require.Equal(t, 0, noCreated.SequenceNo)
}

func testMetadataRoundTrip(t *testing.T, s domain.EventStore) {
	ctx := feedtest.Context(t)
	cases := []struct {
		name     string
		metadata map[string]any
		want     map[string]any
	}{
		{"nil becomes empty", nil, map[string]any{}},
		{"empty", map[string]any{}, map[string]any{}},
		{"every JSON kind", map[string]any{
			"string": "v", "number": 3, "float": 0.25, "bool": false, "null": nil,
			"list": []any{"a", 1}, "map": map[string]any{"inner": []string{"x"}},
			"unicode key é😀": "quote \" and ; semicolon",
		}, nil},
		{"correlation IDs", map[string]any{"correlation_id": "c-1", "causation_id": "c-0", "user_id": "u"}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := c.want
			if want == nil {
				want = c.metadata
			}
			agg := feedtest.UniqueID("meta")
			ev := feedtest.NewEvent(agg, "meta.tested", "p")
			ev.Metadata = c.metadata
			require.NoError(t, s.Append(ctx, agg, -1, ev))
			got, err := s.GetEventByID(ctx, ev.ID)
			require.NoError(t, err)
			require.NotNil(t, got.Metadata, "metadata is never nil on read")
			requireJSONEqual(t, want, got.Metadata)
			feed, err := s.ReadAfter(ctx, got.Position-1, 1)
			require.NoError(t, err)
			require.Len(t, feed, 1)
			require.NotNil(t, feed[0].Metadata)
			requireJSONEqual(t, want, feed[0].Metadata)
		})
	}
}

func testExpectedVersion(t *testing.T, s domain.EventStore) {
	ctx := feedtest.Context(t)
	agg := feedtest.UniqueID("version")
	require.NoError(t, s.Append(ctx, agg, 0, feedtest.NewEvent(agg, "a", 1), feedtest.NewEvent(agg, "b", 2)))

	cases := []struct {
		name     string
		expected int
		wantErr  error
	}{
		{"stale version", 0, domain.ErrConcurrencyConflict},
		{"one behind", 1, domain.ErrConcurrencyConflict},
		{"ahead", 3, domain.ErrConcurrencyConflict},
		{"far ahead", 1000, domain.ErrConcurrencyConflict},
		{"negative other than -1", -2, domain.ErrInvalidEvent},
		{"current version", 2, nil},
		{"-1 skips the check", -1, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := stateOf(t, s, agg)
			ev := feedtest.NewEvent(agg, "c", c.name)
			ev.Metadata = nil
			if c.name == "current version" {
				// Expect what the store says now, as a real caller would.
				v, err := s.GetCurrentVersion(ctx, agg)
				require.NoError(t, err)
				require.Equal(t, c.expected, v)
			}
			err := s.Append(ctx, agg, c.expected, ev)
			if c.wantErr == nil {
				require.NoError(t, err)
				after := stateOf(t, s, agg)
				require.Equal(t, before.version+1, after.version)
				got, err := s.GetEventByID(ctx, ev.ID)
				require.NoError(t, err)
				require.Equal(t, before.version+1, got.SequenceNo)
				return
			}
			require.ErrorIs(t, err, c.wantErr)
			require.Contains(t, err.Error(), agg, "the error names the aggregate")
			require.Equal(t, before, stateOf(t, s, agg), "a rejected append persists nothing")
			_, err = s.GetEventByID(ctx, ev.ID)
			require.ErrorIs(t, err, domain.ErrEventNotFound)
		})
	}
	// -1 on an aggregate that does not exist yet starts it at 1.
	fresh := feedtest.UniqueID("fresh")
	require.NoError(t, s.Append(ctx, fresh, -1, feedtest.NewEvent(fresh, "a", nil)))
	v, err := s.GetCurrentVersion(ctx, fresh)
	require.NoError(t, err)
	require.Equal(t, 1, v)
}

func testExpectedVersionWithoutEvents(t *testing.T, s domain.EventStore) {
	ctx := feedtest.Context(t)
	agg := feedtest.UniqueID("noevents")
	require.NoError(t, s.Append(ctx, agg, 0, feedtest.NewEvent(agg, "a", nil)))
	cases := []struct {
		name     string
		expected int
		wantErr  error
	}{
		{"matching version", 1, nil},
		{"-1", -1, nil},
		{"mismatch", 0, domain.ErrConcurrencyConflict},
		{"invalid expected version", -5, domain.ErrInvalidEvent},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := stateOf(t, s, agg)
			err := s.Append(ctx, agg, c.expected)
			if c.wantErr == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, c.wantErr)
			}
			require.Equal(t, before, stateOf(t, s, agg), "an append of no events persists nothing")
		})
	}
	err := s.Append(ctx, "", -1)
	require.ErrorIs(t, err, domain.ErrInvalidEvent, "the aggregate ID is checked even without events")
}

// testConcurrentAppendsOneWinner races appends with the same expected
// version: exactly one may win, the others see a conflict.
func testConcurrentAppendsOneWinner(t *testing.T, s domain.EventStore) {
	ctx := feedtest.Context(t)
	agg := feedtest.UniqueID("race")
	const writers = 6
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			errs[i] = s.Append(ctx, agg, 0, feedtest.NewEvent(agg, "raced", i), feedtest.NewEvent(agg, "raced", i))
		})
	}
	wg.Wait()
	wins := 0
	for _, err := range errs {
		if err == nil {
			wins++
			continue
		}
		require.ErrorIs(t, err, domain.ErrConcurrencyConflict)
	}
	require.Equal(t, 1, wins)
	events, err := s.GetEvents(ctx, agg)
	require.NoError(t, err)
	require.Equal(t, []int{1, 2}, feedtest.SequenceNos(events))
	require.Equal(t, events[0].Payload, events[1].Payload, "both events come from the winning append")
}

func testSequenceNumbers(t *testing.T, s domain.EventStore) {
	ctx := feedtest.Context(t)
	agg := feedtest.UniqueID("seq")

	// Zero sequence numbers are assigned, continuing across appends.
	require.NoError(t, s.Append(ctx, agg, 0, feedtest.NewEvent(agg, "a", nil), feedtest.NewEvent(agg, "a", nil)))
	require.NoError(t, s.Append(ctx, agg, 2, feedtest.NewEvent(agg, "a", nil)))

	// Explicit, correct sequence numbers are accepted, also after the
	// first append and mixed with zero ones.
	e4 := domain.NewEventEnvelope[any](nil, agg, "a", 4)
	e5 := domain.NewEventEnvelope[any](nil, agg, "a", 0)
	e6 := domain.NewEventEnvelope[any](nil, agg, "a", 6)
	require.NoError(t, s.Append(ctx, agg, 3, e4, e5, e6))
	require.NoError(t, s.Append(ctx, agg, -1, domain.NewEventEnvelope[any](nil, agg, "a", 7)))

	events, err := s.GetEvents(ctx, agg)
	require.NoError(t, err)
	require.Equal(t, []int{1, 2, 3, 4, 5, 6, 7}, feedtest.SequenceNos(events))
	feedtest.RequireStrictlyIncreasing(t, events)

	cases := []struct {
		name    string
		seqs    []int
		wantErr error
	}{
		{"already stored", []int{7}, domain.ErrConcurrencyConflict},
		{"far in the past", []int{1}, domain.ErrConcurrencyConflict},
		{"gap", []int{9}, domain.ErrInvalidEvent},
		{"gap inside the batch", []int{8, 10}, domain.ErrInvalidEvent},
		{"repeated inside the batch", []int{8, 8}, domain.ErrInvalidEvent},
		{"negative", []int{-1}, domain.ErrInvalidEvent},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := stateOf(t, s, agg)
			var evs []domain.EventEnvelope[any]
			for _, seq := range c.seqs {
				evs = append(evs, domain.NewEventEnvelope[any](nil, agg, "bad", seq))
			}
			err := s.Append(ctx, agg, -1, evs...)
			require.ErrorIs(t, err, c.wantErr)
			require.Contains(t, err.Error(), evs[len(evs)-1].ID[:8], "the error names the event")
			require.Equal(t, before, stateOf(t, s, agg))
		})
	}
}

func testGetEventsRanges(t *testing.T, s domain.EventStore) {
	ctx := feedtest.Context(t)
	agg, other := feedtest.UniqueID("range"), feedtest.UniqueID("other")
	for i := range 5 {
		// Interleave another aggregate, which must never show up.
		require.NoError(t, s.Append(ctx, agg, i, feedtest.NewEvent(agg, "r", i+1)))
		require.NoError(t, s.Append(ctx, other, i, feedtest.NewEvent(other, "o", i+1)))
	}
	all := []int{1, 2, 3, 4, 5}
	rangeCases := []struct {
		name     string
		from, to int
		want     []int
	}{
		{"everything", -1, -1, all},
		{"explicit everything", 1, 5, all},
		{"from zero", 0, -1, all},
		{"middle", 2, 4, []int{2, 3, 4}},
		{"single", 3, 3, []int{3}},
		{"from > to", 4, 2, []int{}},
		{"to zero", -1, 0, []int{}},
		{"to beyond the end", 4, 100, []int{4, 5}},
		{"from the last", 5, -1, []int{5}},
		{"from beyond the end", 6, -1, []int{}},
		{"entirely beyond the end", 7, 9, []int{}},
		{"open start", -1, 2, []int{1, 2}},
	}
	for _, c := range rangeCases {
		t.Run("range/"+c.name, func(t *testing.T) {
			got, err := s.GetEventsRange(ctx, agg, c.from, c.to)
			require.NoError(t, err)
			require.NotNil(t, got)
			require.Equal(t, c.want, feedtest.SequenceNos(got))
			for _, e := range got {
				require.Equal(t, agg, e.AggregateID)
				requireJSONEqual(t, e.SequenceNo, e.Payload)
			}
		})
	}
	fromCases := []struct {
		from int
		want []int
	}{{-1, all}, {0, all}, {1, all}, {3, []int{3, 4, 5}}, {5, []int{5}}, {6, []int{}}, {100, []int{}}}
	for _, c := range fromCases {
		got, err := s.GetEventsFromVersion(ctx, agg, c.from)
		require.NoError(t, err)
		require.NotNil(t, got)
		require.Equal(t, c.want, feedtest.SequenceNos(got), "GetEventsFromVersion(%d)", c.from)
	}
	got, err := s.GetEvents(ctx, agg)
	require.NoError(t, err)
	require.Equal(t, all, feedtest.SequenceNos(got))
	feedtest.RequireStrictlyIncreasing(t, got)

	unknown := []func() ([]domain.EventEnvelope[any], error){
		func() ([]domain.EventEnvelope[any], error) { return s.GetEvents(ctx, "unknown") },
		func() ([]domain.EventEnvelope[any], error) { return s.GetEventsFromVersion(ctx, "unknown", 1) },
		func() ([]domain.EventEnvelope[any], error) { return s.GetEventsRange(ctx, "unknown", -1, -1) },
	}
	for i, read := range unknown {
		got, err := read()
		require.NoError(t, err, "read #%d", i)
		require.NotNil(t, got, "read #%d of an unknown aggregate returns an empty, non-nil list", i)
		require.Empty(t, got)
	}
}

func testGetEventByID(t *testing.T, s domain.EventStore) {
	ctx := feedtest.Context(t)
	agg := feedtest.UniqueID("byid")
	ev := feedtest.NewEvent(agg, "x", map[string]any{"k": "v"})
	require.NoError(t, s.Append(ctx, agg, 0, ev))
	got, err := s.GetEventByID(ctx, ev.ID)
	require.NoError(t, err)
	require.Equal(t, ev.ID, got.ID)
	require.Equal(t, agg, got.AggregateID)

	_, err = s.GetEventByID(ctx, "no-such-event")
	require.ErrorIs(t, err, domain.ErrEventNotFound)
	require.Contains(t, err.Error(), "no-such-event")
	require.NotErrorIs(t, err, domain.ErrInvalidEvent)

	_, err = s.GetEventByID(ctx, "")
	require.ErrorIs(t, err, domain.ErrInvalidEvent)
	require.Contains(t, err.Error(), "event ID")
}

func testGetEventsByTransactionID(t *testing.T, s domain.EventStore) {
	ctx := feedtest.Context(t)
	tx, otherTx := feedtest.UniqueID("tx"), feedtest.UniqueID("tx")
	// Aggregate IDs whose byte order differs from a linguistic order, and
	// appends in an order that is neither.
	aggs := []string{feedtest.UniqueID("b"), feedtest.UniqueID("B"), feedtest.UniqueID("a"), feedtest.UniqueID("é"), feedtest.UniqueID("A")}
	withTx := func(agg string, txID string) domain.EventEnvelope[any] {
		e := feedtest.NewEvent(agg, "t", agg)
		e.TransactionID = txID
		return e
	}
	for round := range 2 {
		for _, agg := range aggs {
			require.NoError(t, s.Append(ctx, agg, -1,
				withTx(agg, tx), withTx(agg, otherTx), withTx(agg, ""), withTx(agg, tx)))
		}
		_ = round
	}
	got, err := s.GetEventsByTransactionID(ctx, tx)
	require.NoError(t, err)
	require.Len(t, got, len(aggs)*4)
	for i := 1; i < len(got); i++ {
		prev, cur := got[i-1], got[i]
		require.Equal(t, tx, cur.TransactionID)
		if prev.AggregateID == cur.AggregateID {
			require.Less(t, prev.SequenceNo, cur.SequenceNo, "within an aggregate, sequence order")
		} else {
			require.Less(t, prev.AggregateID, cur.AggregateID, "aggregates in byte order of their IDs")
		}
	}
	for _, e := range got {
		require.Contains(t, []int{1, 4, 5, 8}, e.SequenceNo)
	}

	other, err := s.GetEventsByTransactionID(ctx, otherTx)
	require.NoError(t, err)
	require.Len(t, other, len(aggs)*2)

	none, err := s.GetEventsByTransactionID(ctx, "unknown-tx")
	require.NoError(t, err)
	require.NotNil(t, none)
	require.Empty(t, none)

	_, err = s.GetEventsByTransactionID(ctx, "")
	require.ErrorIs(t, err, domain.ErrInvalidEvent)
	require.Contains(t, err.Error(), "transaction ID")
}

func testGetCurrentVersion(t *testing.T, s domain.EventStore) {
	ctx := feedtest.Context(t)
	agg := feedtest.UniqueID("cv")
	v, err := s.GetCurrentVersion(ctx, agg)
	require.NoError(t, err)
	require.Equal(t, 0, v)
	for i := 1; i <= 3; i++ {
		require.NoError(t, s.Append(ctx, agg, -1, feedtest.NewEvent(agg, "x", nil)))
		v, err := s.GetCurrentVersion(ctx, agg)
		require.NoError(t, err)
		require.Equal(t, i, v)
	}
	_, err = s.GetCurrentVersion(ctx, "")
	require.ErrorIs(t, err, domain.ErrInvalidEvent)
	require.Contains(t, err.Error(), "aggregate ID")
}

func testInvalidAppends(t *testing.T, s domain.EventStore) {
	ctx := feedtest.Context(t)
	agg := feedtest.UniqueID("invalid")
	require.NoError(t, s.Append(ctx, agg, 0, feedtest.NewEvent(agg, "seed", nil)))

	good := func() domain.EventEnvelope[any] { return feedtest.NewEvent(agg, "good", map[string]any{"ok": true}) }
	with := func(f func(e *domain.EventEnvelope[any])) domain.EventEnvelope[any] {
		e := good()
		f(&e)
		return e
	}
	cases := []struct {
		name      string
		aggregate string
		events    []domain.EventEnvelope[any]
		// mention is a text the error must contain: the offending
		// argument's name or the offending event's ID.
		mention string
	}{
		{"empty aggregate ID", "", []domain.EventEnvelope[any]{good()}, "aggregate ID"},
		{"empty event type", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.EventType = "" })}, "event type"},
		{"empty event ID", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.ID = "" })}, "event ID"},
		{"aggregate mismatch", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.AggregateID = "someone-else" })}, "someone-else"},
		{"chan payload", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Payload = make(chan int) })}, "payload"},
		{"func payload", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Payload = func() {} })}, "payload"},
		{"func nested in payload", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Payload = map[string]any{"f": []any{func() {}}} })}, "payload"},
		{"NaN payload", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Payload = math.NaN() })}, "payload"},
		{"infinite number nested", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Payload = []any{math.Inf(1)} })}, "payload"},
		{"invalid UTF-8 payload string", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Payload = "bad \xff\xfe" })}, "UTF-8"},
		{"invalid UTF-8 nested", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Payload = map[string]any{"k": []any{"\xc3\x28"}} })}, "UTF-8"},
		{"invalid UTF-8 map key", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Payload = map[string]any{"\xff": 1} })}, "UTF-8"},
		{"NUL in payload string", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Payload = "a\x00b" })}, "NUL"},
		{"NUL in nested map key", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Payload = map[string]any{"x": map[string]any{"a\x00": 1}} })}, "NUL"},
		{"NUL in struct field", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Payload = payloadStruct{Name: "\x00"} })}, "NUL"},
		{"NUL escape in raw JSON", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Payload = json.RawMessage(`"a\u0000b"`) })}, "NUL"},
		{"invalid raw JSON", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Payload = json.RawMessage(`{"a":`) })}, "payload"},
		{"invalid UTF-8 bytes in raw JSON", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Payload = json.RawMessage("\"\xff\"") })}, "payload"},
		{"lone surrogate escape in raw JSON", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Payload = json.RawMessage(`["\ud800"]`) })}, "payload"},
		// Valid JSON that a reader could not decode (numbers are read back
		// as float64): stored, it would fail every feed read covering it.
		{"raw JSON number beyond float64", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Payload = json.RawMessage(`{"n": 1e400}`) })}, "float64"},
		{"big integer beyond float64", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Payload = []any{new(big.Int).Lsh(big.NewInt(1), 1100)} })}, "float64"},
		{"json.Number beyond float64 in metadata", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Metadata = map[string]any{"n": json.Number("-2e308")} })}, "float64"},
		{"raw JSON number rounding to zero", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Payload = json.RawMessage(`[1e-400]`) })}, "rounds to 0"},
		{"raw JSON zero with a huge negative exponent", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Payload = json.RawMessage(`{"z": 0e-20000}`) })}, "exponent"},
		{"raw JSON zero with a huge exponent", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Payload = json.RawMessage(`[0e99999999999999999999]`) })}, "exponent"},
		{"raw JSON long decimal", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Payload = json.RawMessage("0." + strings.Repeat("0", 17000)) })}, "decimal places"},
		{"invalid UTF-8 metadata", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Metadata = map[string]any{"k": "\xff"} })}, "metadata"},
		{"chan metadata", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.Metadata = map[string]any{"c": make(chan int)} })}, "metadata"},
		{"NUL event ID", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.ID = "id\x00" })}, "event ID"},
		{"invalid UTF-8 event ID", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.ID = "id\xff" })}, "event ID"},
		{"NUL aggregate ID", "agg\x00", []domain.EventEnvelope[any]{feedtest.NewEvent("agg\x00", "t", nil)}, "aggregate ID"},
		{"invalid UTF-8 event type", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.EventType = "\xff" })}, "event type"},
		{"NUL transaction ID", agg, []domain.EventEnvelope[any]{with(func(e *domain.EventEnvelope[any]) { e.TransactionID = "\x00" })}, "transaction ID"},
		{"same ID twice in one append", agg, func() []domain.EventEnvelope[any] {
			e := good()
			return []domain.EventEnvelope[any]{e, e}
		}(), "twice"},
		// The first event is valid: the whole append must still be refused.
		{"second event invalid", agg, []domain.EventEnvelope[any]{good(), with(func(e *domain.EventEnvelope[any]) { e.Payload = make(chan int) })}, "event #2"},
		{"last of many invalid", agg, append([]domain.EventEnvelope[any]{good(), good(), good()}, with(func(e *domain.EventEnvelope[any]) { e.EventType = "" })), "event #4"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := stateOf(t, s, agg)
			err := s.Append(ctx, c.aggregate, -1, c.events...)
			require.ErrorIs(t, err, domain.ErrInvalidEvent)
			require.NotErrorIs(t, err, domain.ErrConcurrencyConflict)
			require.Contains(t, err.Error(), c.mention)
			last := c.events[len(c.events)-1]
			if c.mention != "aggregate ID" && last.ID != "" {
				// IDs are quoted (and escaped) in errors.
				require.Contains(t, err.Error(), strconv.Quote(last.ID), "the error names the offending event")
			}
			require.Equal(t, before, stateOf(t, s, agg), "nothing is persisted")
			for _, e := range c.events {
				if e.ID == "" || !utf8.ValidString(e.ID) || strings.ContainsRune(e.ID, 0) {
					continue
				}
				_, err := s.GetEventByID(ctx, e.ID)
				require.ErrorIs(t, err, domain.ErrEventNotFound, "event %s of a refused append", e.ID)
			}
		})
	}
}

// testInvalidReadArguments checks reads with invalid arguments; max is the
// identifier bound, 0 for none.
func testInvalidReadArguments(t *testing.T, s domain.EventStore, max int) {
	ctx := feedtest.Context(t)
	cases := []struct {
		name    string
		read    func() error
		mention string
	}{
		{"GetEvents empty aggregate", func() error { _, err := s.GetEvents(ctx, ""); return err }, "aggregate ID"},
		{"GetEventsFromVersion empty aggregate", func() error { _, err := s.GetEventsFromVersion(ctx, "", 1); return err }, "aggregate ID"},
		{"GetEventsRange empty aggregate", func() error { _, err := s.GetEventsRange(ctx, "", -1, -1); return err }, "aggregate ID"},
		{"GetEventsRange from < -1", func() error { _, err := s.GetEventsRange(ctx, "agg", -2, -1); return err }, "-2"},
		{"GetEventsRange to < -1", func() error { _, err := s.GetEventsRange(ctx, "agg", 1, -3); return err }, "-3"},
		{"GetEventsFromVersion < -1", func() error { _, err := s.GetEventsFromVersion(ctx, "agg", -7); return err }, "-7"},
		{"GetCurrentVersion NUL", func() error { _, err := s.GetCurrentVersion(ctx, "a\x00"); return err }, "aggregate ID"},
		{"GetEventByID invalid UTF-8", func() error { _, err := s.GetEventByID(ctx, "\xff"); return err }, "event ID"},
		{"GetEventsByTransactionID too long", func() error {
			_, err := s.GetEventsByTransactionID(ctx, strings.Repeat("t", max+1))
			return err
		}, "transaction ID"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if max <= 0 && strings.HasSuffix(c.name, " too long") {
				t.Skip("the store has no identifier bound")
			}
			err := c.read()
			require.ErrorIs(t, err, domain.ErrInvalidEvent)
			require.Contains(t, err.Error(), c.mention)
		})
	}
}

func testDuplicateEventID(t *testing.T, s domain.EventStore) {
	ctx := feedtest.Context(t)
	agg, other := feedtest.UniqueID("dup"), feedtest.UniqueID("dup-other")
	first := feedtest.NewEvent(agg, "x", "first")
	require.NoError(t, s.Append(ctx, agg, 0, first))
	cases := []struct {
		name      string
		aggregate string
	}{
		{"same aggregate", agg},
		{"another aggregate", other},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := stateOf(t, s, c.aggregate)
			fresh := feedtest.NewEvent(c.aggregate, "x", "fresh")
			dup := first
			dup.AggregateID = c.aggregate
			dup.SequenceNo = 0
			dup.Payload = "second"
			err := s.Append(ctx, c.aggregate, -1, fresh, dup)
			require.ErrorIs(t, err, domain.ErrInvalidEvent)
			require.NotErrorIs(t, err, domain.ErrConcurrencyConflict)
			require.Contains(t, err.Error(), c.aggregate)
			require.Equal(t, before, stateOf(t, s, c.aggregate))
			_, err = s.GetEventByID(ctx, fresh.ID)
			require.ErrorIs(t, err, domain.ErrEventNotFound)
			got, err := s.GetEventByID(ctx, first.ID)
			require.NoError(t, err)
			requireJSONEqual(t, "first", got.Payload, "the stored event is not overwritten")
			require.Equal(t, agg, got.AggregateID)
		})
	}
}

func testReadAfterLimits(t *testing.T, s domain.EventStore) {
	ctx := feedtest.Context(t)
	a, b := feedtest.UniqueID("feed-a"), feedtest.UniqueID("feed-b")
	var appended []string
	for i := range 3 {
		ea := feedtest.NewEvent(a, "a", i)
		require.NoError(t, s.Append(ctx, a, -1, ea))
		eb1, eb2 := feedtest.NewEvent(b, "b", i), feedtest.NewEvent(b, "b", i)
		require.NoError(t, s.Append(ctx, b, -1, eb1, eb2))
		appended = append(appended, ea.ID, eb1.ID, eb2.ID)
	}
	all, err := s.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	require.Equal(t, appended, feedtest.IDs(all), "the feed is in append order across aggregates")
	feedtest.RequireStrictlyIncreasing(t, all)
	head, err := s.HeadPosition(ctx)
	require.NoError(t, err)
	require.Equal(t, all[len(all)-1].Position, head)
	n := len(all)
	pos := func(i int) int64 { return all[i].Position }

	cases := []struct {
		name  string
		after int64
		limit int
		want  []int // indexes into all
	}{
		{"from the start, no limit", 0, 0, span(0, n)},
		{"negative limit means no limit", 0, -1, span(0, n)},
		{"very negative limit", 0, math.MinInt32, span(0, n)},
		{"limit 1", 0, 1, span(0, 1)},
		{"limit 2", 0, 2, span(0, 2)},
		{"limit equal to the history", 0, n, span(0, n)},
		{"limit larger than the history", 0, 1000, span(0, n)},
		{"after the first", pos(0), 0, span(1, n)},
		{"middle window", pos(2), 2, span(3, 5)},
		{"after the last but one", pos(n - 2), 10, span(n-1, n)},
		{"after the head", head, 0, nil},
		{"after the head, limit", head, 5, nil},
		{"far beyond the head", head + 1000, 0, nil},
		{"negative position", -100, 0, span(0, n)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := s.ReadAfter(ctx, c.after, c.limit)
			require.NoError(t, err)
			require.NotNil(t, got, "an empty feed read is an empty, non-nil list")
			want := []string{}
			for _, i := range c.want {
				want = append(want, all[i].ID)
			}
			require.Equal(t, want, feedtest.IDs(got))
			for _, e := range got {
				require.Greater(t, e.Position, c.after)
			}
		})
	}
}

func span(from, to int) []int {
	out := []int{}
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

func testEmptyStore(t *testing.T, s domain.EventStore) {
	ctx := feedtest.Context(t)
	head, err := s.HeadPosition(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(0), head)
	for _, limit := range []int{0, 1, 100} {
		feed, err := s.ReadAfter(ctx, 0, limit)
		require.NoError(t, err)
		require.NotNil(t, feed)
		require.Empty(t, feed)
	}
	events, err := s.GetEvents(ctx, "nobody")
	require.NoError(t, err)
	require.NotNil(t, events)
	require.Empty(t, events)
	byTx, err := s.GetEventsByTransactionID(ctx, "nothing")
	require.NoError(t, err)
	require.NotNil(t, byTx)
	require.Empty(t, byTx)
	_, err = s.GetEventByID(ctx, "nothing")
	require.ErrorIs(t, err, domain.ErrEventNotFound)

	// The first append gets a positive position, and the head follows.
	require.NoError(t, s.Append(ctx, "first", 0, feedtest.NewEvent("first", "x", nil)))
	head, err = s.HeadPosition(ctx)
	require.NoError(t, err)
	require.Positive(t, head)
	feed, err := s.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	require.Equal(t, []int64{head}, feedtest.Positions(feed))
}

// testIdentifierLimits checks the identifier bound max (skipped if 0).
func testIdentifierLimits(t *testing.T, s domain.EventStore, max int) {
	if max <= 0 {
		t.Skip("the store has no identifier bound")
	}
	ctx := feedtest.Context(t)
	// "é" is two bytes: strings at the byte bound, not the rune bound.
	atLimit := strings.Repeat("é", max/2)
	require.Len(t, atLimit, max)
	over := atLimit + "x"

	// At the limit every identifier is kept exactly.
	ev := feedtest.NewEvent(atLimit, atLimit, nil)
	ev.ID = atLimit
	ev.TransactionID = atLimit
	require.NoError(t, s.Append(ctx, atLimit, 0, ev))
	got, err := s.GetEventByID(ctx, atLimit)
	require.NoError(t, err)
	require.Equal(t, atLimit, got.AggregateID)
	require.Equal(t, atLimit, got.EventType)
	require.Equal(t, atLimit, got.TransactionID)

	agg := feedtest.UniqueID("limits")
	cases := []struct {
		name      string
		aggregate string
		modify    func(e *domain.EventEnvelope[any])
		mention   string
	}{
		{"aggregate ID", over, func(e *domain.EventEnvelope[any]) {}, "aggregate ID"},
		{"event ID", agg, func(e *domain.EventEnvelope[any]) { e.ID = over }, "event ID"},
		{"event type", agg, func(e *domain.EventEnvelope[any]) { e.EventType = over }, "event type"},
		{"transaction ID", agg, func(e *domain.EventEnvelope[any]) { e.TransactionID = over }, "transaction ID"},
	}
	for _, c := range cases {
		t.Run("too long "+c.name, func(t *testing.T) {
			before := stateOf(t, s, agg)
			e := feedtest.NewEvent(c.aggregate, "t", nil)
			c.modify(&e)
			err := s.Append(ctx, c.aggregate, -1, e)
			require.ErrorIs(t, err, domain.ErrInvalidEvent)
			require.Contains(t, err.Error(), c.mention)
			require.Contains(t, err.Error(), "bytes", "the error says what the limit is about")
			require.Less(t, len(err.Error()), 2*max, "the error does not echo the whole identifier")
			require.Equal(t, before, stateOf(t, s, agg))
		})
	}
	_, err = s.GetEvents(ctx, over)
	require.ErrorIs(t, err, domain.ErrInvalidEvent)
	_, err = s.GetEventByID(ctx, over)
	require.ErrorIs(t, err, domain.ErrInvalidEvent)
}

// testLongUnicodeIdentifiers stores identifiers of 1000 runes; max is the
// identifier bound they must fit, 0 for none.
func testLongUnicodeIdentifiers(t *testing.T, s domain.EventStore, max int) {
	ctx := feedtest.Context(t)
	unit := []rune(`é'";😀\ %_` + "\t\n")
	long := func(prefix string) string {
		r := []rune(prefix)
		for i := 0; len(r) < 1000; i++ {
			r = append(r, unit[i%len(unit)])
		}
		return string(r)
	}
	agg, id, tx := long("agg"), long("id"), long("tx")
	require.Equal(t, 1000, utf8.RuneCountInString(agg))
	if max > 0 {
		require.LessOrEqual(t, len(agg), max)
	}

	ev := feedtest.NewEvent(agg, "weird.type;'\"", map[string]any{agg: id})
	ev.ID = id
	ev.TransactionID = tx
	require.NoError(t, s.Append(ctx, agg, 0, ev))
	require.NoError(t, s.Append(ctx, agg, 1, feedtest.NewEvent(agg, "second", nil)))

	got, err := s.GetEventByID(ctx, id)
	require.NoError(t, err)
	require.Equal(t, id, got.ID)
	require.Equal(t, agg, got.AggregateID)
	require.Equal(t, tx, got.TransactionID)
	require.Equal(t, "weird.type;'\"", got.EventType)
	requireJSONEqual(t, map[string]any{agg: id}, got.Payload)

	events, err := s.GetEvents(ctx, agg)
	require.NoError(t, err)
	require.Len(t, events, 2)
	require.Equal(t, id, events[0].ID)
	v, err := s.GetCurrentVersion(ctx, agg)
	require.NoError(t, err)
	require.Equal(t, 2, v)
	byTx, err := s.GetEventsByTransactionID(ctx, tx)
	require.NoError(t, err)
	require.Equal(t, []string{id}, feedtest.IDs(byTx))

	// A prefix or a LIKE-pattern lookalike matches nothing.
	for _, near := range []string{agg[:len(agg)-1], strings.ReplaceAll(agg, "%", "x"), "%"} {
		v, err := s.GetCurrentVersion(ctx, near)
		require.NoError(t, err)
		require.Equal(t, 0, v)
	}
	_, err = s.GetEventByID(ctx, id+" ")
	require.True(t, errors.Is(err, domain.ErrEventNotFound), "got %v", err)
}

func testCanceledContext(t *testing.T, s domain.EventStore) {
	ctx := feedtest.Context(t)
	require.NoError(t, s.Append(ctx, "agg", 0, feedtest.NewEvent("agg", "x", nil)))
	before := stateOf(t, s, "agg")

	canceled, cancel := context.WithCancel(ctx)
	cancel()
	ev := feedtest.NewEvent("agg", "x", nil)
	err := s.Append(canceled, "agg", 1, ev)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, before, stateOf(t, s, "agg"), "a canceled append stores nothing")
	_, err = s.ReadAfter(canceled, 0, 0)
	require.ErrorIs(t, err, context.Canceled)
}
