package subscriptionstest

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/feedtest"
)

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

// storeState is what a rejected append must leave unchanged.
type storeState struct {
	head    int64
	version int
	feed    []string
}

func stateOf(t testing.TB, s domain.EventStore, aggregateID string) storeState {
	t.Helper()
	ctx := feedtest.Context(t)
	head, err := s.HeadPosition(ctx)
	require.NoError(t, err)
	var version int
	if aggregateID != "" {
		version, err = s.GetCurrentVersion(ctx, aggregateID)
		require.NoError(t, err)
	}
	feed, err := s.ReadAfter(ctx, 0, 0)
	require.NoError(t, err)
	return storeState{head: head, version: version, feed: feedtest.IDs(feed)}
}

// has returns v as the capability C, or skips the test, naming the type
// that lacks it: each capability's suite runs only on the backends that
// have it.
func has[C any](t *testing.T, v any) C {
	t.Helper()
	c, ok := v.(C)
	if !ok {
		t.Skipf("%T does not implement %s", v, reflect.TypeFor[C]())
	}
	return c
}
