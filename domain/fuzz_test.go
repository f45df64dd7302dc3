package domain_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/domain"
)

// refValidPattern is the reference for which patterns Subscribe accepts:
// non-empty, and no empty dot-separated segment.
func refValidPattern(pattern string) bool {
	return pattern != "" &&
		!strings.HasPrefix(pattern, ".") &&
		!strings.HasSuffix(pattern, ".") &&
		!strings.Contains(pattern, "..")
}

// refMatch is the reference matcher, written independently of the
// dispatcher's: it walks pattern and event type one segment at a time.
// "*" matches exactly one segment, whatever it holds; every other segment
// must be equal. An event type's segments are what lies between its dots,
// so a malformed type such as "a..b" has an empty middle segment, which
// "*" matches like any other.
func refMatch(pattern, eventType string) bool {
	for {
		p, pRest, pMore := strings.Cut(pattern, ".")
		e, eRest, eMore := strings.Cut(eventType, ".")
		if p != "*" && p != e {
			return false
		}
		if pMore != eMore {
			return false // different number of segments
		}
		if !pMore {
			return true
		}
		pattern, eventType = pRest, eRest
	}
}

func TestRefMatch(t *testing.T) {
	for _, tt := range []struct {
		pattern, eventType string
		want               bool
	}{
		{"user.created", "user.created", true},
		{"user.*", "user.created", true},
		{"*.created", "user.created", true},
		{"*.*", "user.created", true},
		{"user", "user.created", false},
		{"*", "user.created", false},
		{"user.created.x", "user.created", false},
		{"a.*.c", "a.b.c", true},
		{"*.*.*", "a.b.c", true},
		{"a.*", "a.b.c", false},
		{"*", "x", true},
	} {
		require.Equal(t, tt.want, refMatch(tt.pattern, tt.eventType), "%q ~ %q", tt.pattern, tt.eventType)
	}
}

func FuzzDispatchPattern(f *testing.F) {
	for _, s := range [][2]string{
		{"user.created", "user.created"},
		{"user.*", "user.created"},
		{"*.created", "user.created"},
		{"*.*", "user.created"},
		{"user", "user.created"},
		{"*", "user.created"},
		{"user.created.x", "user.created"},
		{"a.*.c", "a.b.c"},
		{"*.*.*", "a.b.c"},
		{"", ""},
		{"*", ""},
		{"a..b", "a..b"},
		{"a.*.b", "a..b"},
		{".", "."},
		{"**", "ab"},
		{"a.b*", "a.bc"},
		{"ü.*", "ü.\xff"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, eventType string) {
		d := domain.NewEventDispatcher()
		var typedCalls, anyCalls int
		err := domain.Subscribe(d, pattern, func(_ context.Context, env domain.EventEnvelope[struct{}]) error {
			typedCalls++
			return nil
		})
		if !refValidPattern(pattern) {
			require.ErrorIs(t, err, domain.ErrInvalidEvent, "pattern %q", pattern)
			return
		}
		require.NoError(t, err, "pattern %q", pattern)
		require.NoError(t, domain.Subscribe(d, pattern, domain.EventHandler[any](func(context.Context, domain.EventEnvelope[any]) error {
			anyCalls++
			return nil
		})))

		want := 0
		if refMatch(pattern, eventType) {
			want = 1
		}
		env := domain.EventEnvelope[any]{ID: "evt-fuzz", EventType: eventType, Payload: map[string]any{}}
		require.NoError(t, d.Dispatch(context.Background(), env))
		require.Equal(t, want, typedCalls, "pattern %q, event type %q", pattern, eventType)
		require.Equal(t, want, anyCalls, "pattern %q, event type %q", pattern, eventType)
		// Second dispatch: served from the route cache, same answer.
		require.NoError(t, d.Dispatch(context.Background(), env))
		require.Equal(t, 2*want, typedCalls, "cached route: pattern %q, event type %q", pattern, eventType)
		require.Equal(t, 2*want, anyCalls, "cached route: pattern %q, event type %q", pattern, eventType)

		// A pattern always matches an event of its own type.
		if !strings.Contains(pattern, "*") {
			require.True(t, refMatch(pattern, pattern))
		}
	})
}

type fuzzInner struct {
	X []bool `json:"x"`
}

type fuzzStruct struct {
	A int             `json:"a"`
	B string          `json:"b"`
	C []float64       `json:"c"`
	D map[string]bool `json:"d"`
	E *fuzzInner      `json:"e"`
	F any             `json:"f"`
}

func FuzzTypedDecode(f *testing.F) {
	for _, s := range []string{
		`{"a":1,"b":"x","c":[1.5,2],"d":{"k":true},"e":{"x":[true,false]},"f":null}`,
		`{"A":1,"a":2}`,
		`{"name":"y","NAME":"x"}`,
		`[1,2,3]`,
		`[1.5]`,
		`"hello"`,
		`null`,
		`42`,
		`9007199254740993`,
		`1e400`,
		`{} {}`,
		`{"a":1}x`,
		``,
		` `,
		`not json`,
		`{"a":"1"}`,
		`"\ud800"`,
		"\"\xff\"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		forms := []struct {
			name    string
			payload any
			// ref is the JSON whose json.Unmarshal into T the handler must
			// see: the bytes themselves for raw forms, the re-encoded value
			// for decoded forms (decoding to any loses precision and case
			// distinctions that a direct decode would keep).
			ref []byte
		}{
			{"json.RawMessage", json.RawMessage(append([]byte(nil), data...)), data},
			{"[]byte", append([]byte(nil), data...), data},
		}
		var decodedAny any
		if json.Unmarshal(data, &decodedAny) == nil {
			forms = append(forms, struct {
				name    string
				payload any
				ref     []byte
			}{"decoded any", decodedAny, mustMarshal(t, decodedAny)})
		}
		var decodedMap map[string]any
		if json.Unmarshal(data, &decodedMap) == nil {
			forms = append(forms, struct {
				name    string
				payload any
				ref     []byte
			}{"decoded map", decodedMap, mustMarshal(t, decodedMap)})
		}
		for _, form := range forms {
			checkTypedDecode[fuzzStruct](t, form.name, form.payload, form.ref)
			checkTypedDecode[map[string]any](t, form.name, form.payload, form.ref)
			checkTypedDecode[[]int](t, form.name, form.payload, form.ref)
			checkTypedDecode[string](t, form.name, form.payload, form.ref)
		}
	})
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

func checkTypedDecode[T any](t *testing.T, form string, payload any, ref []byte) {
	t.Helper()
	typeName := reflect.TypeFor[T]().String()
	d := domain.NewEventDispatcher()
	var (
		got    T
		called bool
	)
	require.NoError(t, domain.Subscribe(d, "fuzz.decoded", func(_ context.Context, env domain.EventEnvelope[T]) error {
		got, called = env.Payload, true
		return nil
	}))
	env := domain.EventEnvelope[any]{ID: "evt-fuzz-1", EventType: "fuzz.decoded", Payload: payload}
	err := d.Dispatch(context.Background(), env)

	var want T
	refErr := json.Unmarshal(ref, &want)
	where := fmt.Sprintf("%s payload into %s (ref %q)", form, typeName, ref)
	if err != nil {
		require.ErrorIs(t, err, domain.ErrInvalidEvent, where)
		msg := err.Error()
		require.Contains(t, msg, "evt-fuzz-1", where)
		require.Contains(t, msg, "fuzz.decoded", where)
		require.Contains(t, msg, typeName, where)
		require.Contains(t, msg, fmt.Sprintf("%T", payload), where)
		require.False(t, called, where)
		require.Error(t, refErr, "%s: Dispatch failed but json.Unmarshal succeeds: %v", where, err)
		return
	}
	require.True(t, called, where)
	require.NoError(t, refErr, "%s: decoded although json.Unmarshal fails", where)
	require.Equal(t, want, got, where)
}
