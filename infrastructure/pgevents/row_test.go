package pgevents

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestEnvelope(t *testing.T) {
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))
	for _, c := range []struct {
		name         string
		payload      string
		metadata     string
		wantPayload  any
		wantMetadata map[string]any
		wantErr      string
	}{
		{name: "object payload, no metadata", payload: `{"n":1}`, wantPayload: map[string]any{"n": float64(1)}, wantMetadata: map[string]any{}},
		{name: "empty payload", wantPayload: nil, metadata: `{"k":"v"}`, wantMetadata: map[string]any{"k": "v"}},
		{name: "empty objects", payload: `{}`, metadata: `{}`, wantPayload: map[string]any{}, wantMetadata: map[string]any{}},
		{name: "metadata not an object", payload: `"s"`, metadata: `[1]`, wantPayload: "s", wantMetadata: map[string]any{}},
		{name: "bad payload", payload: `{`, wantErr: `event e1 (type "t", position 7): decode payload`},
		{name: "bad metadata", payload: `1`, metadata: `nope`, wantErr: `event e1 (type "t", position 7): decode metadata`},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := Row{ID: "e1", AggregateID: "a", EventType: "t", SequenceNo: 2, TransactionID: "tx", Position: 7,
				Payload: []byte(c.payload), Metadata: []byte(c.metadata), CreatedAt: created}
			env, err := r.Envelope()
			if c.wantErr != "" {
				require.Error(t, err)
				require.True(t, strings.HasPrefix(err.Error(), c.wantErr), err.Error())
				_, err = Envelopes([]Row{{ID: "ok", Payload: []byte("1")}, r})
				require.Error(t, err, "one bad row fails the read")
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.wantPayload, env.Payload)
			require.Equal(t, c.wantMetadata, env.Metadata)
			require.Equal(t, time.UTC, env.Created.Location())
			require.True(t, env.Created.Equal(created))
			require.Equal(t, []any{"e1", "a", "t", 2, "tx", int64(7)}, []any{env.ID, env.AggregateID, env.EventType, env.SequenceNo, env.TransactionID, env.Position})
		})
	}
}

func TestTargetsFollowColumns(t *testing.T) {
	var r Row
	require.Len(t, r.Targets(), len(strings.Split(Columns, ",")))
}

func TestPositionsArray(t *testing.T) {
	require.Equal(t, "{}", PositionsArray(nil))
	require.Equal(t, "{7}", PositionsArray([]int64{7}))
	require.Equal(t, "{1,-2,9223372036854775807}", PositionsArray([]int64{1, -2, 1<<63 - 1}))
}
