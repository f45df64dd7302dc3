package subscriptionstest

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
	"github.com/eventfeed/subscriptions/internal/feedtest"
)

// The limits every store enforces the same way, before anything reaches a
// database: Created within years 1-9999 (UTC), and at most 1000 levels of
// JSON arrays and objects, counted alike for Go values and raw JSON.

func testCreatedRange(t *testing.T, s domain.EventStore) {
	ctx := feedtest.Context(t)
	cases := []struct {
		name    string
		created time.Time
		ok      bool
	}{
		{"year 1 (its first instant is the zero time, which means now)", time.Date(1, 1, 1, 0, 0, 0, 1000, time.UTC), true},
		{"last microsecond of year 9999", time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC), true},
		{"year 0", time.Date(0, 6, 1, 0, 0, 0, 0, time.UTC), false},
		{"negative year", time.Date(-44, 3, 15, 0, 0, 0, 0, time.UTC), false},
		{"year 10000", time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), false},
		{"year 1 east of UTC is year 0 in UTC", time.Date(1, 1, 1, 0, 30, 0, 0, time.FixedZone("UTC+1", 3600)), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			agg := feedtest.UniqueID("created")
			ev := feedtest.NewEvent(agg, "created.range", "x")
			ev.Created = c.created
			before := stateOf(t, s, agg)
			err := s.Append(ctx, agg, -1, ev)
			if !c.ok {
				require.ErrorIs(t, err, domain.ErrInvalidEvent)
				require.Contains(t, err.Error(), "outside years 1-9999")
				require.Equal(t, before, stateOf(t, s, agg), "nothing is persisted")
				return
			}
			require.NoError(t, err)
			got, err := s.GetEventByID(ctx, ev.ID)
			require.NoError(t, err)
			require.Equal(t, c.created.UTC(), got.Created)
		})
	}
}

// nestedValue wraps a leaf in n levels of Go maps and slices, alternately.
func nestedValue(n int) any {
	var v any = 1.0
	for i := range n {
		if i%2 == 0 {
			v = []any{v}
		} else {
			v = map[string]any{"k": v}
		}
	}
	return v
}

type nestedStruct struct {
	Next *nestedStruct `json:"next,omitempty"`
}

type embeddingStruct struct {
	nestedStruct
	Name string `json:"name"`
}

// nestedStructs is n levels of JSON objects made of Go structs.
func nestedStructs(n int) any {
	var v *nestedStruct
	for range n {
		v = &nestedStruct{Next: v}
	}
	return v
}

// nestedRaw is n levels of arrays as raw JSON.
func nestedRaw(n int) any {
	return json.RawMessage(strings.Repeat("[", n) + "1" + strings.Repeat("]", n))
}

func testNestingDepth(t *testing.T, s domain.EventStore) {
	ctx := feedtest.Context(t)
	cases := []struct {
		name  string
		value func(n int) any
	}{
		{"Go maps and slices", nestedValue},
		{"Go structs", nestedStructs},
		{"raw JSON", nestedRaw},
	}
	for _, c := range cases {
		for _, n := range []int{1000, 1001} {
			for _, field := range []string{"payload", "metadata"} {
				t.Run(c.name+"/"+field+"/"+map[int]string{1000: "1000 levels", 1001: "1001 levels"}[n], func(t *testing.T) {
					agg := feedtest.UniqueID("depth")
					ev := feedtest.NewEvent(agg, "depth.test", "x")
					if field == "payload" {
						ev.Payload = c.value(n)
					} else {
						// The metadata object itself is the first level.
						ev.Metadata = map[string]any{"deep": c.value(n - 1)}
					}
					err := s.Append(ctx, agg, -1, ev)
					if n > 1000 {
						require.ErrorIs(t, err, domain.ErrInvalidEvent)
						require.Contains(t, err.Error(), field+": nested deeper than 1000 levels of JSON arrays and objects")
						return
					}
					require.NoError(t, err)
					got, err := s.GetEventByID(ctx, ev.ID)
					require.NoError(t, err)
					if field == "payload" {
						requireJSONEqual(t, ev.Payload, got.Payload)
					} else {
						requireJSONEqual(t, ev.Metadata, got.Metadata)
					}
				})
			}
		}
	}
	t.Run("an embedded struct adds no level", func(t *testing.T) {
		// 999 arrays around an object whose fields come from an embedded
		// struct: 1000 levels of JSON.
		var v any = embeddingStruct{Name: "e"}
		for range 999 {
			v = []any{v}
		}
		agg := feedtest.UniqueID("depth")
		require.NoError(t, s.Append(ctx, agg, -1, feedtest.NewEvent(agg, "depth.test", v)))
	})
}
