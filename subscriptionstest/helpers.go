package subscriptionstest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
)

var idCounter atomic.Int64

// uniqueID returns an identifier never returned before in this process.
func uniqueID(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, idCounter.Add(1))
}

// newEvent returns an unpersisted envelope with a fresh ID and sequence
// number 0 (assigned by the store).
func newEvent(aggregateID, eventType string, payload any) domain.EventEnvelope[any] {
	return domain.NewEventEnvelope[any](payload, aggregateID, eventType, 0)
}

// testCtx is a context that ends with the test (or after a generous
// safety deadline, so that a hang fails instead of blocking the run).
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// jsonOf is v's JSON encoding; it fails the test when v has none.
func jsonOf(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

// requireJSONEqual compares two values by their JSON encodings: a
// database store decodes objects as map[string]any and numbers as
// float64, so Go values are compared by what they mean as JSON.
func requireJSONEqual(t testing.TB, want, got any, msgAndArgs ...any) {
	t.Helper()
	require.JSONEq(t, jsonOf(t, want), jsonOf(t, got), msgAndArgs...)
}

// ids returns the events' IDs in order.
func ids(events []domain.EventEnvelope[any]) []string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = e.ID
	}
	return out
}

// positions returns the events' positions in order.
func positions(events []domain.EventEnvelope[any]) []int64 {
	out := make([]int64, len(events))
	for i, e := range events {
		out[i] = e.Position
	}
	return out
}

// sequenceNos returns the events' sequence numbers in order.
func sequenceNos(events []domain.EventEnvelope[any]) []int {
	out := make([]int, len(events))
	for i, e := range events {
		out[i] = e.SequenceNo
	}
	return out
}

// requireStrictlyIncreasing fails unless positions increase strictly and
// are all positive.
func requireStrictlyIncreasing(t testing.TB, events []domain.EventEnvelope[any]) {
	t.Helper()
	var last int64
	for i, e := range events {
		require.Greater(t, e.Position, last, "event #%d (%s) is not after the previous position", i, e.ID)
		last = e.Position
	}
}

// storeState is what a rejected append must leave unchanged.
type storeState struct {
	head    int64
	version int
	feed    []string
}

func stateOf(t testing.TB, s domain.EventStore, aggregateID string) storeState {
	t.Helper()
	ctx := testCtx(t)
	head, err := s.HeadPosition(ctx)
	require.NoError(t, err)
	var version int
	if aggregateID != "" {
		version, err = s.GetCurrentVersion(ctx, aggregateID)
		require.NoError(t, err)
	}
	feed, err := s.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	return storeState{head: head, version: version, feed: ids(feed)}
}
