package pgevents_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/eventfeed/subscriptions/infrastructure/pgevents"
	"github.com/eventfeed/subscriptions/internal/feedtest"
)

// TestReadEnvelopesMatchesRows: the reused buffers of ReadEnvelopes give
// every row the envelope Row.Envelope gives it scanned on its own (a
// NULL payload, metadata of every shape, payloads shorter after longer),
// whatever its limit; a row that does not decode fails the whole read
// with a *DecodeError.
func TestReadEnvelopesMatchesRows(t *testing.T) {
	ctx := feedtest.Context(t)
	pg := migratedPostgres(t)
	conn := pgConnect(t, pg.DSN)
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for i, c := range []struct{ payload, metadata any }{
		{`{"n": 1, "note": "a longer payload than the next"}`, `{}`},
		{`{"n": 2}`, `{"k": "v", "nested": {"x": [1, 2]}}`},
		{nil, nil},
		{`[1, "two", null]`, `[1]`},
		{`"s"`, `{}`},
		{`{}`, `null`},
	} {
		_, err := conn.Exec(ctx, `INSERT INTO events (id, aggregate_id, event_type, sequence_no, transaction_id, position, payload, metadata, created_at)
			VALUES ($1, 'a', 't', $2, 'tx', $2, $3::jsonb, $4::jsonb, $5)`, "e"+string(rune('0'+i)), i+1, c.payload, c.metadata, created)
		require.NoError(t, err)
	}
	query := pgevents.SelectEvents + "ORDER BY position"

	rows, err := conn.Query(ctx, query)
	require.NoError(t, err)
	stored, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (pgevents.Row, error) {
		var r pgevents.Row
		return r, row.Scan(r.Targets()...)
	})
	require.NoError(t, err)
	want, err := pgevents.Envelopes(stored)
	require.NoError(t, err)
	require.Len(t, want, 6)
	require.Nil(t, want[2].Payload, "a NULL payload")

	for _, limit := range []int{0, 1, 4, 6, 100} {
		rows, err = conn.Query(ctx, query)
		require.NoError(t, err)
		got, err := pgevents.ReadEnvelopes(rows, limit)
		require.NoError(t, err)
		require.Equal(t, want, got, "the limit only sizes the slice (%d)", limit)
	}

	rows, err = conn.Query(ctx, query+" LIMIT 0")
	require.NoError(t, err)
	none, err := pgevents.ScanEnvelopes(rows)
	require.NoError(t, err)
	require.NotNil(t, none, "an empty read is an empty, non-nil slice")
	require.Empty(t, none)

	// Valid jsonb that encoding/json cannot hold in a float64.
	_, err = conn.Exec(ctx, `INSERT INTO events (id, aggregate_id, event_type, sequence_no, transaction_id, position, payload, metadata, created_at)
		VALUES ('huge', 'a', 't', 7, 'tx', 7, '1e400'::jsonb, '{}'::jsonb, $1)`, created)
	require.NoError(t, err)
	rows, err = conn.Query(ctx, query)
	require.NoError(t, err)
	got, err := pgevents.ReadEnvelopes(rows, 10)
	require.ErrorContains(t, err, `event huge (type "t", position 7): decode payload`)
	var undecodable *pgevents.DecodeError
	require.ErrorAs(t, err, &undecodable, "told from a failed read")
	require.Equal(t, "huge", undecodable.ID)
	require.Equal(t, "payload", undecodable.Column)
	require.Nil(t, got)
}
